package redisstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Consumer reads a Redis stream as one consumer of a consumer group,
// claims each entry through an idempotent.Middleware, runs its handler
// for a new claim in the claim's transaction, and acknowledges (XACK) the
// entry only after the transaction has committed, settling every delivery
// by adapter.Rule.Settle. It is safe for concurrent use; Run may be called
// again, or on several streams at once (each Run is a consumer of the
// group under the Consumer's name: give each concurrent Run a Consumer of
// its own name).
type Consumer struct {
	mw     *idempotent.Middleware
	handle Handler      // per-message mode
	batch  BatchHandler // batch mode
	cfg    config
	rule   adapter.Rule
	dead   *adapter.DeadLetters // with WithDeadLetter
	events adapter.Counter      // counts, then tells the Observer
}

// NewConsumer returns a per-message Consumer: each entry is claimed
// through mw and, when its claim is new, handled by h (often built with
// Decode) in the claim's transaction, one transaction per entry. It fails
// if mw or h is nil, an option is invalid, or mw is in partitioned mode
// and the options leave it without a producer's event time
// (adapter.ErrNoProducerEventTime). It sends nothing to Redis; Run does.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("redisstream: NewConsumer: nil handler")
	}
	cfg, err := newConfig("NewConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if cfg.batchSize != 0 {
		return nil, errors.New("redisstream: NewConsumer: WithBatchSize is for NewBatchConsumer")
	}
	return newConsumer(mw, cfg, h, nil)
}

// NewBatchConsumer returns a batch Consumer: each worker takes the entries
// of one XREADGROUP (up to WithBatchSize), claims them all in one
// transaction with mw.ProcessMessages, and hands h the fresh ones, so a
// batch's claims and effects commit together. Each entry is then settled
// on its own, as the rule says. It fails as NewConsumer does. It sends
// nothing to Redis; Run does.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("redisstream: NewBatchConsumer: nil handler")
	}
	cfg, err := newConfig("NewBatchConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if cfg.batchSize == 0 {
		cfg.batchSize = DefaultBatchSize
	}
	return newConsumer(mw, cfg, nil, h)
}

func newConsumer(mw *idempotent.Middleware, cfg config, h Handler, b BatchHandler) (*Consumer, error) {
	c := &Consumer{mw: mw, handle: h, batch: b, cfg: cfg, rule: cfg.Rule()}
	c.events.Next = cfg.Observer()
	if cfg.deadLetter != nil {
		dead, err := adapter.NewDeadLetters("redisstream", mw, cfg.deadLetter, DeadLetterKind)
		if err != nil {
			return nil, err
		}
		c.dead = dead
	}
	return c, nil
}

// Stats returns the counts of the Consumer's events so far, over all its
// Runs: every delivery it finished is in exactly one of Applied,
// Duplicates and DeadLettered; Requeued counts requeues (an entry counted
// again when it comes back), Released the entries left pending unhandled
// at shutdown.
func (c *Consumer) Stats() adapter.Stats { return c.events.Stats() }

// Name is the Consumer's name in the consumer group (WithConsumerName).
func (c *Consumer) Name() string { return c.cfg.name }

// Run reads stream as the Consumer's name in group until ctx ends or
// the client is closed. It creates the group (from the stream's first
// entry, "0", creating the stream too) when it does not exist. It reads new
// entries with XREADGROUP, re-reads its requeued entries after their
// delay, and re-claims with XAUTOCLAIM the entries of the group left
// pending longer than the claim idle bound (see the package
// documentation).
//
// When ctx ends, Run shuts down gracefully: it reads nothing more, lets
// in-flight entries finish — with a context that is not cancelled, for up
// to the shutdown timeout — and acknowledges them; entries it read but had
// not begun stay pending, unacknowledged (EventReleased), as do the
// requeued ones, for the group's next consumer to re-claim. Run then
// returns nil.
//
// Failed reads are retried with backoff (EventFetchError). Run returns an
// error matching ErrClientClosed when the client was closed and ErrNoGroup
// when the group or the stream was deleted; in-flight handlers finish
// first (their XACKs may fail: those entries are re-claimed later, and the
// claims make them duplicates). A panic in the handler is not recovered.
func (c *Consumer) Run(ctx context.Context, client redis.UniversalClient, stream, group string) error {
	if client == nil || stream == "" || group == "" {
		return errors.New("redisstream: Run: nil client, or empty stream or group name")
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := client.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil && code(err) != "BUSYGROUP" {
		if errors.Is(err, redis.ErrClosed) {
			return fmt.Errorf("%w: %w", ErrClientClosed, err)
		}
		return fmt.Errorf("redisstream: create group %q on stream %q: %w", group, stream, err)
	}

	// Handlers run with a context that outlives ctx, so that a shutdown
	// lets in-flight transactions commit; it ends after the shutdown
	// timeout, or when Run returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout(), hcancel) })
	defer stopTimer()
	// reading ends with ctx, or on a fatal error.
	reading, stop := context.WithCancel(ctx)
	defer stop()

	r := &run{c: c, rdb: client, stream: stream, group: group, name: c.cfg.name,
		source: stream + "/" + group, work: make(chan []*Delivery), held: map[string]struct{}{},
		wake: make(chan struct{}, 1), stop: stop}

	// The keeper touches what the Run holds until the workers are done.
	kctx, kcancel := context.WithCancel(hctx)
	var kwg sync.WaitGroup
	kwg.Go(func() { r.keep(kctx) })

	var wg sync.WaitGroup
	wg.Go(func() { r.read(reading, hctx) })
	wg.Go(func() { r.reclaim(reading, hctx) })
	wg.Go(func() { r.schedule(reading, hctx) })
	if c.batch == nil && c.cfg.Routed() {
		r.routed(reading, hctx, &wg)
	} else {
		for range c.cfg.Workers() {
			wg.Go(func() {
				for {
					select {
					case <-reading.Done():
						return
					case ds := <-r.work:
						if c.batch != nil {
							r.handleBatch(hctx, ds)
						} else {
							r.handleOne(hctx, ds[0])
						}
					}
				}
			})
		}
		wg.Wait()
	}
	kcancel()
	kwg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// routed runs the per-message workers of a Consumer whose Middleware
// keeps order (adapter.Config.Routed): the readers' deliveries go to the
// worker of their ordering key, so that one entity's entries are handled
// one after another, in the order they were read, and need not park,
// while other entities' run on the other workers. It returns once the
// readers (wg) are done and the workers have handled, or released, what
// was handed to them.
func (r *run) routed(reading, hctx context.Context, wg *sync.WaitGroup) {
	key := func(ds []*Delivery) string { return r.c.cfg.RouteKey(ds[0]) }
	var workers sync.WaitGroup
	for _, work := range adapter.Route(r.work, r.c.cfg.Workers(), 1, key) {
		workers.Go(func() {
			for ds := range work {
				if reading.Err() != nil {
					r.release(hctx, ds)
					continue
				}
				r.handleOne(hctx, ds[0])
			}
		})
	}
	wg.Wait()
	close(r.work)
	workers.Wait()
}

// code returns the error code of a Redis error reply, its first word
// ("NOGROUP", "BUSYGROUP"): the protocol's way of telling errors apart.
func code(err error) string {
	var re redis.Error
	if !errors.As(err, &re) {
		return ""
	}
	w, _, _ := strings.Cut(re.Error(), " ")
	return w
}

// run is one Run's state.
type run struct {
	c                   *Consumer
	rdb                 redis.UniversalClient
	stream, group, name string
	source              string // "<stream>/<group>"
	work                chan []*Delivery
	stop                context.CancelFunc
	wake                chan struct{} // a requeue due sooner than the scheduler waits for
	mu                  sync.Mutex
	held                map[string]struct{} // ids read and not yet acknowledged or released
	parked              []parked            // requeued entries, by due time
	fatal               error
}

// parked is a requeued entry waiting for its delay.
type parked struct {
	id    string
	due   time.Time
	count int64 // the delivery count when it was requeued
}

// fail ends the Run with err, the first fatal error.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.fatal == nil {
		r.fatal = err
	}
	r.mu.Unlock()
	r.stop()
}

// failed reports whether err ends the Run, and ends it if so.
func (r *run) failed(err error) bool {
	switch {
	case errors.Is(err, redis.ErrClosed):
		r.fail(fmt.Errorf("%w: stream %q, group %q: %w", ErrClientClosed, r.stream, r.group, err))
	case code(err) == "NOGROUP":
		r.fail(fmt.Errorf("%w: stream %q, group %q: %w", ErrNoGroup, r.stream, r.group, err))
	default:
		return false
	}
	return true
}

// hold adds the entries of msgs not held already to the held set and
// returns them.
func (r *run) hold(msgs []redis.XMessage) []redis.XMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := msgs[:0:0]
	for _, m := range msgs {
		if _, ok := r.held[m.ID]; ok {
			continue
		}
		r.held[m.ID] = struct{}{}
		out = append(out, m)
	}
	return out
}

func (r *run) unhold(ids ...string) {
	r.mu.Lock()
	for _, id := range ids {
		delete(r.held, id)
	}
	r.mu.Unlock()
}

// fetchError reports a failed read that will be retried, and waits the
// backoff, or until reading ends.
func (r *run) fetchError(reading, hctx context.Context, what string, err error, backoff *time.Duration) {
	r.c.events.Observe(hctx, adapter.Event{Type: adapter.EventFetchError, Source: r.source,
		Err: fmt.Errorf("redisstream: %s of %s: %w", what, r.source, err)})
	*backoff = min(max(2**backoff, 20*time.Millisecond), 2*time.Second)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-reading.Done():
	case <-t.C:
	}
}

// read reads new entries (">") until reading ends.
func (r *run) read(reading, hctx context.Context) {
	count := int64(readCount)
	if r.c.batch != nil {
		count = int64(r.c.cfg.batchSize)
	}
	var backoff time.Duration
	for reading.Err() == nil {
		// Not reading's context: a read Redis answered must be seen, or
		// its entries would be pending to no one until re-claimed.
		res, err := r.rdb.XReadGroup(context.WithoutCancel(reading), &redis.XReadGroupArgs{
			Group: r.group, Consumer: r.name, Streams: []string{r.stream, ">"}, Count: count, Block: r.c.cfg.block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			backoff = 0
			continue
		}
		if err != nil {
			if r.failed(err) || reading.Err() != nil {
				return
			}
			r.fetchError(reading, hctx, "XREADGROUP", err, &backoff)
			continue
		}
		backoff = 0
		for _, s := range res {
			ds := make([]*Delivery, 0, len(s.Messages))
			for _, m := range r.hold(s.Messages) {
				ds = append(ds, newDelivery(r.stream, m, 1))
			}
			r.dispatch(reading, hctx, ds)
		}
	}
}

// reclaim re-claims, every quarter of the claim idle bound (at most five
// seconds), the group's entries pending longer than it, until reading
// ends.
func (r *run) reclaim(reading, hctx context.Context) {
	every := min(max(r.c.cfg.claimIdle/4, 5*time.Millisecond), 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	count := int64(readCount)
	if r.c.batch != nil {
		count = int64(r.c.cfg.batchSize)
	}
	var backoff time.Duration
	for {
		select {
		case <-reading.Done():
			return
		case <-t.C:
		}
		for cursor := "0-0"; reading.Err() == nil; {
			msgs, next, err := r.rdb.XAutoClaim(hctx, &redis.XAutoClaimArgs{Stream: r.stream, Group: r.group,
				MinIdle: r.c.cfg.claimIdle, Start: cursor, Count: count, Consumer: r.name}).Result()
			if err != nil {
				if !r.failed(err) {
					r.fetchError(reading, hctx, "XAUTOCLAIM", err, &backoff)
				}
				break
			}
			backoff = 0
			if msgs = r.hold(msgs); len(msgs) > 0 {
				ds, err := r.counted(hctx, msgs)
				if err != nil {
					// Left held: the keeper keeps them from others for
					// no purpose, so let them go to be re-claimed.
					r.unhold(ids(msgs)...)
					if !r.failed(err) {
						r.fetchError(reading, hctx, "XPENDING", err, &backoff)
					}
					break
				}
				r.dispatch(reading, hctx, ds)
			}
			if next == "0-0" || next == "" {
				break
			}
			cursor = next
		}
	}
}

// counted returns the deliveries of msgs, re-claimed, with the group's
// delivery count of each (XPENDING, one pipeline).
func (r *run) counted(ctx context.Context, msgs []redis.XMessage) ([]*Delivery, error) {
	p := r.rdb.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(msgs))
	for i, m := range msgs {
		cmds[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: r.group, Start: m.ID, End: m.ID, Count: 1})
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, err
	}
	ds := make([]*Delivery, len(msgs))
	for i, m := range msgs {
		n := int64(1)
		if pe := cmds[i].Val(); len(pe) == 1 && pe[0].RetryCount > 0 {
			n = pe[0].RetryCount
		}
		ds[i] = newDelivery(r.stream, m, n)
	}
	return ds, nil
}

func ids(msgs []redis.XMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// dispatch hands ds to the workers — one by one for a per-message
// Consumer, together for a batch one — or, once reading ends, releases
// what is left of them.
func (r *run) dispatch(reading, hctx context.Context, ds []*Delivery) {
	if len(ds) == 0 {
		return
	}
	if r.c.batch != nil {
		select {
		case r.work <- ds:
		case <-reading.Done():
			r.release(hctx, ds)
		}
		return
	}
	for i, d := range ds {
		select {
		case r.work <- []*Delivery{d}:
		case <-reading.Done():
			r.release(hctx, ds[i:])
			return
		}
	}
}

// release leaves ds pending, unhandled: the Run is stopping.
func (r *run) release(ctx context.Context, ds []*Delivery) {
	for _, d := range ds {
		r.unhold(d.ID)
		msg, _ := r.c.cfg.Message(d)
		r.c.events.Observe(ctx, adapter.Event{Type: adapter.EventReleased, Message: msg, Source: r.source + "/" + d.ID, Detail: d})
	}
}

// park requeues the entry of d: it stays pending to the Run and is read
// again after delay.
func (r *run) park(d *Delivery, delay time.Duration) {
	r.mu.Lock()
	p := parked{id: d.ID, due: time.Now().Add(delay), count: d.Count}
	i := len(r.parked)
	for i > 0 && r.parked[i-1].due.After(p.due) {
		i--
	}
	r.parked = append(r.parked, parked{})
	copy(r.parked[i+1:], r.parked[i:])
	r.parked[i] = p
	first := i == 0
	r.mu.Unlock()
	if first {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// schedule reads requeued entries again (XCLAIM to the Run itself, which
// counts a delivery) once their delay is over, until reading ends. What is
// parked then stays pending, to be re-claimed by the group's next
// consumer after the claim idle bound.
func (r *run) schedule(reading, hctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var backoff time.Duration
	for {
		r.mu.Lock()
		wait := time.Hour
		if len(r.parked) > 0 {
			wait = time.Until(r.parked[0].due)
		}
		r.mu.Unlock()
		t.Reset(max(wait, 0))
		select {
		case <-reading.Done():
			return
		case <-r.wake:
			continue
		case <-t.C:
		}
		now := time.Now()
		r.mu.Lock()
		n := 0
		for n < len(r.parked) && n < MaxBatchSize && !r.parked[n].due.After(now) {
			n++
		}
		due := append([]parked(nil), r.parked[:n]...)
		r.parked = r.parked[n:]
		r.mu.Unlock()
		if n == 0 {
			continue
		}
		pids := make([]string, n)
		for i, p := range due {
			pids[i] = p.id
		}
		msgs, err := r.rdb.XClaim(hctx, &redis.XClaimArgs{Stream: r.stream, Group: r.group, Consumer: r.name, Messages: pids}).Result()
		if err != nil {
			if r.failed(err) {
				return
			}
			r.mu.Lock()
			for i := range due {
				due[i].due = now.Add(max(2*backoff, 20*time.Millisecond))
			}
			r.parked = append(due, r.parked...)
			r.mu.Unlock()
			r.fetchError(reading, hctx, "XCLAIM", err, &backoff)
			continue
		}
		backoff = 0
		got := make(map[string]redis.XMessage, len(msgs))
		for _, m := range msgs {
			got[m.ID] = m
		}
		var ds []*Delivery
		for _, p := range due {
			m, ok := got[p.id]
			if !ok {
				// Trimmed from the stream (or acknowledged by another
				// consumer that re-claimed it): nothing to read again.
				r.unhold(p.id)
				continue
			}
			ds = append(ds, newDelivery(r.stream, m, p.count+1))
		}
		if r.c.batch != nil {
			for len(ds) > 0 {
				k := min(len(ds), r.c.cfg.batchSize)
				r.dispatch(reading, hctx, ds[:k])
				ds = ds[k:]
			}
		} else {
			r.dispatch(reading, hctx, ds)
		}
	}
}

// keep touches every entry the Run holds (XCLAIM … JUSTID to itself, which
// resets its idle time and counts no delivery) every third of the claim
// idle bound, so that no consumer's XAUTOCLAIM takes entries in flight or
// waiting for their requeue delay.
func (r *run) keep(ctx context.Context) {
	t := time.NewTicker(max(r.c.cfg.claimIdle/3, 3*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		all := make([]string, 0, len(r.held))
		for id := range r.held {
			all = append(all, id)
		}
		r.mu.Unlock()
		for len(all) > 0 {
			k := min(len(all), 1000)
			// A failure is harmless: at worst another consumer re-claims
			// an entry, and its claim makes it a duplicate or busy.
			_ = r.rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: r.stream, Group: r.group, Consumer: r.name, Messages: all[:k]}).Err()
			all = all[k:]
		}
	}
}

// over returns ErrMaxDeliveries for d when it was delivered more times
// than the bound, else nil.
func (r *run) over(d *Delivery) error {
	if r.c.cfg.maxDeliveries > 0 && d.Count > r.c.cfg.maxDeliveries {
		return fmt.Errorf("redisstream: %s: %w (%d deliveries, bound %d)", d, ErrMaxDeliveries, d.Count, r.c.cfg.maxDeliveries)
	}
	return nil
}

// item is one delivery and the Middleware's answer for it.
type item struct {
	d   *Delivery
	msg idempotent.Message
	out idempotent.Outcome
	err error
}

// handleOne claims one entry, runs the handler if the claim is new, and
// settles the delivery.
func (r *run) handleOne(ctx context.Context, d *Delivery) {
	c := r.c
	it := item{d: d}
	it.msg, it.err = c.cfg.Message(d)
	if it.err == nil {
		it.err = r.over(d)
	}
	tctx, end := c.cfg.StartTrace(ctx, d, it.msg)
	if it.err == nil {
		it.out, it.err = c.cfg.Process(tctx, c.mw, d, it.msg, func(ctx context.Context, tx *sql.Tx) error {
			return c.handle(ctx, tx, d)
		})
	}
	end(it.out, it.err)
	r.settle(ctx, []item{it})
}

// handleBatch claims the entries of one read in one transaction, runs the
// batch handler with the fresh ones, and settles every delivery on its
// own. An entry that cannot be claimed (its key or event time is poison,
// or the Middleware would refuse it) is set aside before the transaction;
// one the handler names with adapter.PoisonItem, or the Middleware with an
// idempotent.BatchKeyError, is set aside after it, and the rest run again
// without it.
func (r *run) handleBatch(ctx context.Context, ds []*Delivery) {
	c := r.c
	items := make([]item, len(ds))
	claims := make([]idempotent.Message, len(ds))
	errs := make([]error, len(ds))
	for i, d := range ds {
		it := &items[i]
		it.d = d
		it.msg, it.err = c.cfg.Message(d)
		if it.err == nil {
			it.err = r.over(d)
		}
		claims[i], errs[i] = it.msg, it.err
	}
	tctx, end := c.cfg.StartBatchTrace(ctx, ds, claims)
	results := c.cfg.ProcessBatch(tctx, c.mw, ds, claims, errs, c.batch)
	end(results)
	for i, res := range results {
		items[i].out, items[i].err = res.Outcome, res.Err
	}
	r.settle(ctx, items)
}

// settle settles each delivery of items as the settle rule decides: an
// Ack is an XACK (all of them in one pipeline), a Requeue leaves the entry
// pending and parks it for its delay, a DeadLetter writes the dead letter
// (WithDeadLetter) and is an XACK too. Then it tells the Observer, one
// event per delivery, and an EventSettleFailed after it for an XACK that
// failed.
func (r *run) settle(ctx context.Context, items []item) {
	c := r.c
	evs := make([]adapter.Event, len(items))
	var acks []int
	for i, it := range items {
		d := it.d
		e := adapter.Event{Message: it.msg, Source: r.source + "/" + d.ID, Detail: d}
		attempt := int(min(d.Count, 1<<20))
		dec := c.rule.Settle(it.msg, it.err, attempt)
		if dec.Action == adapter.Requeue && c.cfg.maxDeliveries > 0 && d.Count >= c.cfg.maxDeliveries {
			dec.Action = adapter.DeadLetter
			it.err = fmt.Errorf("redisstream: %s: %w (%d deliveries): %w", d, ErrMaxDeliveries, d.Count, it.err)
		}
		if dec.Action == adapter.DeadLetter && c.dead != nil {
			if err := r.deadLetter(ctx, d, it.msg, it.err); err != nil {
				// The dead letter did not commit: try again later.
				dec = adapter.Decision{Action: adapter.Requeue, Delay: c.rule.Delay(attempt), Err: err}
				it.err = err
			}
		}
		switch dec.Action {
		case adapter.Ack:
			e.Type, e.Attempt = adapter.EventApplied, int(d.Count)
			if it.out == idempotent.Duplicate {
				e.Type = adapter.EventDuplicate
			}
			acks = append(acks, i)
		case adapter.Requeue:
			e.Type, e.Attempt, e.Delay, e.Err = adapter.EventRequeued, int(d.Count), dec.Delay, it.err
			r.park(d, dec.Delay)
		default:
			e.Type, e.Err = adapter.EventDeadLettered, it.err
			if c.dead == nil {
				e.Detail = Dropped{Delivery: d}
			}
			acks = append(acks, i)
		}
		evs[i] = e
	}
	failed := make([]error, len(items))
	if len(acks) > 0 {
		p := r.rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(acks))
		for j, i := range acks {
			cmds[j] = p.XAck(ctx, r.stream, r.group, items[i].d.ID)
		}
		_, _ = p.Exec(ctx) // each command holds its own error
		for j, i := range acks {
			// An entry whose XACK failed stays pending: it is let go, to
			// be re-claimed after the claim idle bound.
			failed[i] = cmds[j].Err()
			r.unhold(items[i].d.ID)
		}
		for _, err := range failed {
			if err != nil && r.failed(err) {
				break // the client is closed: read nothing more
			}
		}
	}
	for i, e := range evs {
		c.events.Observe(ctx, e)
		if failed[i] != nil {
			c.events.Observe(ctx, adapter.Event{Type: adapter.EventSettleFailed, Message: e.Message, Source: e.Source, Attempt: e.Attempt,
				Err: fmt.Errorf("redisstream: XACK of %s: %w", e.Source, failed[i]), Detail: e.Detail})
		}
	}
}
