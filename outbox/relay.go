package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// Relay performs the calls written to an outbox. It leases due rows, calls
// the Sender registered for each row's kind outside any transaction, and
// records the result. Any number of relays, in one process or many, may run
// on one table at once: a row is leased by one relay at a time.
type Relay struct {
	o           *Outbox
	id          string
	senders     map[string]Sender
	kinds       []string
	dsn         string
	listenCheck time.Duration
	poll        time.Duration
	lease       time.Duration
	callTimeout time.Duration
	grace       time.Duration
	concurrency int
	batch       int
	maxAttempts int
	backoff     Backoff
	running     atomic.Bool
}

// NewRelay returns a relay for the rows of o's table whose kinds it has a
// Sender for (see WithSender), whichever consumer enqueued them. It reports
// to o's observer. NewRelay checks its options and sends nothing to the
// database; Run starts the relay.
func NewRelay(o *Outbox, opts ...RelayOption) (*Relay, error) {
	if o == nil {
		return nil, errors.New("outbox: NewRelay: nil Outbox")
	}
	cfg := relayConfig{
		senders:     map[string]Sender{},
		poll:        DefaultPollInterval,
		listenCheck: DefaultListenerCheck,
		lease:       DefaultLease,
		concurrency: DefaultConcurrency,
		batch:       DefaultBatch,
		maxAttempts: DefaultMaxAttempts,
		backoff:     DefaultBackoff(),
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("outbox: NewRelay: nil option")
		}
		if err := opt.applyRelay(&cfg); err != nil {
			return nil, err
		}
	}
	if len(cfg.senders) == 0 {
		return nil, errors.New("outbox: NewRelay: no sender registered (use WithSender)")
	}
	if cfg.callTimeout == 0 {
		cfg.callTimeout = cfg.lease / 2
	}
	if cfg.callTimeout >= cfg.lease {
		return nil, fmt.Errorf("outbox: NewRelay: call timeout %v must be shorter than the lease %v", cfg.callTimeout, cfg.lease)
	}
	if !cfg.graceSet {
		cfg.grace = cfg.callTimeout
	}
	if cfg.id == "" {
		cfg.id = defaultRelayID()
	}
	r := &Relay{
		o: o, id: cfg.id, senders: cfg.senders, dsn: cfg.dsn, listenCheck: cfg.listenCheck,
		poll: cfg.poll, lease: cfg.lease, callTimeout: cfg.callTimeout, grace: cfg.grace,
		concurrency: cfg.concurrency, batch: cfg.batch, maxAttempts: cfg.maxAttempts, backoff: cfg.backoff,
	}
	for k := range cfg.senders {
		r.kinds = append(r.kinds, k)
	}
	sort.Strings(r.kinds)
	return r, nil
}

func defaultRelayID() string {
	host, err := os.Hostname()
	if err != nil || checkName("host", host) != nil || len(host) > 64 {
		host = "relay"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// ID returns the relay's id, as written in lease_owner.
func (r *Relay) ID() string { return r.id }

// Run relays until ctx ends, then stops leasing, waits for the calls in
// flight to finish and their results to be recorded (see
// WithShutdownGrace), and returns nil. It returns an error matching
// ErrNoTable if the table does not exist. Database errors while running do
// not stop it: they are reported as EventRelayError and it tries again at
// the next poll. A Relay runs one Run at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: Relay.Run: already running")
	}
	defer r.running.Store(false)
	if ctx.Err() != nil {
		return nil
	}

	// hard is the context of calls and of recording their results: it
	// outlives ctx by the shutdown grace.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	var graceTimer atomic.Pointer[time.Timer]
	stopAfter := context.AfterFunc(ctx, func() {
		if r.grace == 0 {
			cancelHard()
			return
		}
		graceTimer.Store(time.AfterFunc(r.grace, cancelHard))
	})
	defer func() {
		stopAfter()
		if t := graceTimer.Load(); t != nil {
			t.Stop()
		}
	}()

	wake := make(chan struct{}, 1)
	if r.dsn != "" {
		stopListening := r.listen(ctx, wake)
		defer stopListening()
	}

	// Calls run on goroutines holding a slot; their results go to the
	// recorder, which writes them in batches.
	slots := make(chan struct{}, r.concurrency)
	freed := make(chan struct{}, 1)
	results := make(chan result, r.concurrency)
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		r.recordResults(hard, results)
	}()
	var inflight sync.WaitGroup
	defer func() {
		inflight.Wait()
		close(results)
		<-recorded
	}()

	poll := time.NewTimer(r.poll)
	defer poll.Stop()
	for ctx.Err() == nil {
		// Lease when at least half a batch of slots is free, so that a
		// busy relay leases in batches rather than a row per freed slot.
		free := r.concurrency - len(slots)
		if free == 0 || (free < (min(r.batch, r.concurrency)+1)/2 && free < r.concurrency) {
			select {
			case <-ctx.Done():
			case <-freed:
			}
			continue
		}
		n := min(free, r.batch)
		msgs, err := r.leaseRows(hard, n)
		if err != nil {
			if errors.Is(err, ErrNoTable) {
				return err
			}
			r.observe(hard, Event{Type: EventRelayError, Relay: r.id, Err: err})
		}
		for _, m := range msgs {
			slots <- struct{}{}
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				if res, ok := r.deliver(hard, m); ok {
					results <- res
				}
				<-slots
				select {
				case freed <- struct{}{}:
				default:
				}
			}()
		}
		if err == nil && len(msgs) == n {
			continue // there may be more due rows
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(r.poll)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-poll.C:
		}
	}
	return nil
}

// listen subscribes to the outbox's channel on a dedicated connection and
// signals wake on every notification, and once subscribed (rows committed
// before then sent no notification this relay saw). It returns a function
// that closes the connection and waits for its goroutines.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) (stop func()) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	l := pq.NewListener(r.dsn, 100*time.Millisecond, 2*time.Second, func(ev pq.ListenerEventType, err error) {
		switch ev {
		case pq.ListenerEventDisconnected, pq.ListenerEventConnectionAttemptFailed:
			r.observe(ctx, Event{Type: EventRelayError, Relay: r.id, Err: fmt.Errorf("outbox: LISTEN connection (%v): %w", ev, err)})
		case pq.ListenerEventReconnected:
			r.observe(ctx, Event{Type: EventListening, Relay: r.id})
		}
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := l.Listen(r.o.channel); err != nil {
			if ctx.Err() == nil {
				r.observe(ctx, Event{Type: EventRelayError, Relay: r.id, Err: fmt.Errorf("outbox: LISTEN %s: %w", r.o.channel, err)})
			}
			return
		}
		if !r.checkListen(ctx, l, signal) {
			_ = l.Close()
			for range l.Notify { // closed by Close
			}
			return
		}
		r.observe(ctx, Event{Type: EventListening, Relay: r.id})
		signal()
		// A nil notification follows a reconnection, after which missed
		// notifications are unknowable: wake for it too.
		for range l.Notify {
			signal()
		}
	}()
	return func() {
		_ = l.Close()
		wg.Wait()
	}
}

// checkListen sends a test notification on the outbox's channel through the
// outbox's database and waits for it on l, signalling wake for any other
// notification meanwhile. It reports false, after an
// EventListenUnavailable, if the notification does not arrive within the
// check timeout, and false if ctx ends first. If the test notification
// cannot be sent, it reports the error and trusts the subscription.
func (r *Relay) checkListen(ctx context.Context, l *pq.Listener, signal func()) bool {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	payload := "outbox-listen-check:" + r.id + ":" + hex.EncodeToString(b)
	if _, err := r.o.db.ExecContext(ctx, "SELECT pg_notify($1, $2)", r.o.channel, payload); err != nil {
		if ctx.Err() == nil {
			r.observe(ctx, Event{Type: EventRelayError, Relay: r.id, Err: fmt.Errorf("outbox: test notification on %s: %w", r.o.channel, err)})
		}
		return ctx.Err() == nil
	}
	timer := time.NewTimer(r.listenCheck)
	defer timer.Stop()
	for {
		select {
		case n, ok := <-l.Notify:
			if !ok {
				return false
			}
			if n != nil && n.Extra == payload {
				return true
			}
			signal()
		case <-timer.C:
			r.observe(ctx, Event{Type: EventListenUnavailable, Relay: r.id,
				Err: fmt.Errorf("%w: the test notification on %s did not arrive within %v; polling every %v instead", ErrListenUnavailable, r.o.channel, r.listenCheck, r.poll)})
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// leaseRows leases up to n due rows.
func (r *Relay) leaseRows(ctx context.Context, n int) ([]Message, error) {
	rows, err := r.o.db.QueryContext(ctx, r.o.q.lease, pq.Array(r.kinds), n, r.id, r.lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: lease rows of %s: %w", r.o.table, r.o.tableErr(err))
	}
	defer rows.Close()
	var msgs []Message
	for rows.Next() {
		var m Message
		var at sql.NullTime
		var ns sql.NullInt16
		var parent, state, baggage, orderKey *string
		var orderSeq *int64
		if err := rows.Scan(&m.ID, &m.Consumer, &m.MessageKey, &m.Kind, &m.IdempotencyKey, &m.Payload, &m.Attempt, &m.CreatedAt, &at, &ns,
			&parent, &state, &baggage, &orderKey, &orderSeq); err != nil {
			return msgs, fmt.Errorf("outbox: lease rows of %s: %w", r.o.table, err)
		}
		m.EventTime = eventTimeOf(at, ns)
		m.Trace = traceOf(parent, state, baggage)
		if orderKey != nil && orderSeq != nil {
			m.OrderKey, m.OrderSeq = *orderKey, *orderSeq
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return msgs, fmt.Errorf("outbox: lease rows of %s: %w", r.o.table, err)
	}
	return msgs, nil
}

// result is the outcome of one attempt, to be recorded.
type result struct {
	ev      Event
	t       EventType // EventSent, EventFailed or EventDead
	errText string
}

// deliver makes one attempt at m. It returns false if hard ended first:
// then nothing is recorded, the lease expires and another relay retries.
func (r *Relay) deliver(hard context.Context, m Message) (result, bool) {
	ev := Event{
		Relay: r.id, ID: m.ID, Consumer: m.Consumer, MessageKey: m.MessageKey, Kind: m.Kind,
		IdempotencyKey: m.IdempotencyKey, Attempt: m.Attempt,
	}
	if m.Attempt > r.maxAttempts {
		// The last allowed attempt's relay stopped without a result.
		ev.Err = fmt.Errorf("%w (attempt %d of %d)", ErrLeaseExpired, m.Attempt-1, r.maxAttempts)
		return result{ev: ev, t: EventDead, errText: errorText(ev.Err)}, true
	}
	start := time.Now()
	err := r.call(hard, m)
	ev.Duration = time.Since(start)
	if hard.Err() != nil {
		return result{}, false
	}
	switch {
	case err == nil:
		return result{ev: ev, t: EventSent}, true
	case errors.Is(err, ErrPermanent) || m.Attempt >= r.maxAttempts:
		ev.Err = err
		return result{ev: ev, t: EventDead, errText: errorText(err)}, true
	default:
		ev.Err = err
		ev.Backoff = r.backoff.delay(m.Attempt)
		return result{ev: ev, t: EventFailed, errText: errorText(err)}, true
	}
}

// call runs the sender under the call timeout, in the Tracer's span of the
// attempt if there is one. A panic in the sender is a failed attempt.
func (r *Relay) call(ctx context.Context, m Message) (err error) {
	s := r.senders[m.Kind]
	if s == nil {
		return Permanent(fmt.Errorf("outbox: no sender for kind %q", m.Kind))
	}
	cctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	if t := r.o.tracer; t != nil {
		var end func(error)
		cctx, m.Trace, end = t.StartSend(cctx, m)
		defer func() { end(err) }()
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: sender for %s panicked: %v", m.Kind, p)
		}
	}()
	return s.Send(cctx, m)
}

// maxRecordBatch bounds how many results one markSent statement records.
const maxRecordBatch = 256

// recordResults writes results until the channel is closed: whatever has
// arrived while the previous batch was written goes in the next, so under
// load many rows are marked sent per statement, and when idle each result
// is written at once.
func (r *Relay) recordResults(hard context.Context, results <-chan result) {
	for res := range results {
		batch := []result{res}
	more:
		for len(batch) < maxRecordBatch {
			select {
			case res, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, res)
			default:
				break more
			}
		}
		r.recordBatch(hard, batch)
	}
}

// recordBatch records the results of batch with one statement per kind
// of result.
func (r *Relay) recordBatch(hard context.Context, batch []result) {
	if hard.Err() != nil {
		return // shutting down: the leases expire
	}
	ctx, cancel := context.WithTimeout(hard, r.lease)
	defer cancel()
	var sent, failed, dead marks
	for _, res := range batch {
		switch res.t {
		case EventSent:
			sent.add(res)
		case EventFailed:
			failed.add(res)
			failed.backoffs = append(failed.backoffs, int64((res.ev.Backoff+time.Millisecond-1)/time.Millisecond))
		case EventDead:
			dead.add(res)
		}
	}
	if len(sent.ids) > 0 {
		r.record(ctx, sent, r.o.q.markSent, pq.Int64Array(sent.ids), r.id, pq.Int64Array(sent.attempts))
	}
	if len(failed.ids) > 0 {
		r.record(ctx, failed, r.o.q.markRetry, pq.Int64Array(failed.ids), r.id, pq.Int64Array(failed.attempts),
			pq.Int64Array(failed.backoffs), pq.StringArray(failed.errTexts))
	}
	if len(dead.ids) > 0 {
		r.record(ctx, dead, r.o.q.markDead, pq.Int64Array(dead.ids), r.id, pq.Int64Array(dead.attempts),
			pq.StringArray(dead.errTexts))
	}
}

// marks gathers the results of one kind for a mark statement.
type marks struct {
	results  []result
	ids      []int64
	attempts []int64
	backoffs []int64
	errTexts []string
}

func (m *marks) add(res result) {
	m.results = append(m.results, res)
	m.ids = append(m.ids, res.ev.ID)
	m.attempts = append(m.attempts, int64(res.ev.Attempt))
	m.errTexts = append(m.errTexts, res.errText)
}

// record runs a mark statement and reports each result's event — or
// EventLeaseLost for a row another relay holds now, or EventRelayError if the
// statement failed.
func (r *Relay) record(ctx context.Context, m marks, query string, args ...any) {
	updated, err := r.mark(ctx, query, args...)
	if err != nil && ctx.Err() != nil {
		return // shutting down: the leases expire
	}
	for _, res := range m.results {
		ev := res.ev
		switch {
		case err != nil:
			ev.Type = EventRelayError
			ev.Err = fmt.Errorf("outbox: record %s of row %d: %w", res.t, ev.ID, err)
			if res.ev.Err != nil {
				ev.Err = fmt.Errorf("%w (the attempt failed with: %w)", ev.Err, res.ev.Err)
			}
		case !updated[ev.ID]:
			ev.Type = EventLeaseLost
			ev.Err = errors.Join(ErrLeaseLost, ev.Err)
		default:
			ev.Type = res.t
		}
		r.observe(ctx, ev)
	}
}

// mark runs a mark statement and returns the ids it updated.
func (r *Relay) mark(ctx context.Context, query string, args ...any) (map[int64]bool, error) {
	rows, err := r.o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, r.o.tableErr(err)
	}
	defer rows.Close()
	updated := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		updated[id] = true
	}
	return updated, rows.Err()
}

func (r *Relay) observe(ctx context.Context, e Event) {
	if r.o.observer != nil {
		r.o.observer.Observe(ctx, e)
	}
}
