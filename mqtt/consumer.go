package mqtt

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Consumer receives MQTT 5 messages through paho.golang with manual
// acknowledgement, claims each through an idempotent.Middleware, runs its
// handler for a new claim in the claim's transaction, and acknowledges the
// message (PUBACK at QoS 1, PUBREC at QoS 2) only after the transaction has
// committed. It is safe for concurrent use; Run may be called again, or on
// several Sessions at once (each with its own client id).
type Consumer struct {
	mw     *idempotent.Middleware
	handle Handler      // per-message mode
	batch  BatchHandler // batch mode
	cfg    config
	rule   adapter.Rule
	events adapter.Counter
}

// NewConsumer returns a per-message Consumer: each message is claimed
// through mw and, when its claim is new, handled by h (often built with
// Decode) in the claim's transaction, one transaction per message. It
// fails if mw or h is nil, an option is invalid, or mw is in partitioned
// mode and the options leave it without a producer's event time
// (adapter.ErrNoProducerEventTime). It connects to nothing; Run does.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("mqtt: NewConsumer: nil handler")
	}
	cfg, err := newConfig("NewConsumer", false, mw, opts)
	if err != nil {
		return nil, err
	}
	return newConsumer(mw, cfg, h, nil), nil
}

// NewBatchConsumer returns a batch Consumer: each worker collects up to the
// batch size of received messages (WithBatchSize; after the first, only
// those that arrive within the batch wait, WithBatchWait), claims them all
// in one transaction with mw.ProcessMessages, and hands h the fresh ones,
// so a batch's claims and effects commit together. Each message is then
// settled on its own, as the rule says. It fails as NewConsumer does.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("mqtt: NewBatchConsumer: nil handler")
	}
	cfg, err := newConfig("NewBatchConsumer", true, mw, opts)
	if err != nil {
		return nil, err
	}
	return newConsumer(mw, cfg, nil, h), nil
}

func newConsumer(mw *idempotent.Middleware, cfg config, h Handler, b BatchHandler) *Consumer {
	c := &Consumer{mw: mw, handle: h, batch: b, cfg: cfg, rule: cfg.Rule()}
	c.events.Next = cfg.Observer()
	return c
}

// Stats returns the counts of the Consumer's events so far, over all its
// Runs: every message it finished is in exactly one of Applied, Duplicates
// and DeadLettered; Requeued counts the attempts that failed and were
// retried, Released the messages handed back at shutdown unprocessed.
func (c *Consumer) Stats() adapter.Stats { return c.events.Stats() }

// Defaults of a Session.
const (
	// DefaultSessionExpiry is how long the broker keeps a Session's
	// subscriptions and unacknowledged messages after its connection ends,
	// unless Session.SessionExpiry says otherwise.
	DefaultSessionExpiry = time.Hour
	// DefaultKeepAlive is the MQTT keep-alive unless Session.KeepAlive
	// says otherwise.
	DefaultKeepAlive = 30 * time.Second
	// ackInterval is how often paho sends the acknowledgements the
	// workers marked, in the order the messages came.
	ackInterval = 10 * time.Millisecond
)

// Session is what Run connects with: a persistent MQTT 5 session (Clean
// Start false, a session expiry), so that what the Consumer had not
// acknowledged when its connection ended — a crash, a network failure, a
// restart of the process or of a broker with persistence — is sent again
// on the session's next connection, to be found by its claim.
type Session struct {
	// Dial opens a connection to the broker: net.Dialer.DialContext on
	// "tcp" and "127.0.0.1:1883", a tls.Dialer, a websocket. Run serialises
	// the writes of a connection that is not a sync.Locker itself
	// (packets.NewThreadSafeConn). Required.
	Dial func(ctx context.Context) (net.Conn, error)
	// ClientID names the session; the next connection with it resumes the
	// session. Give each consumer process its own, stable across restarts.
	// Required.
	ClientID string
	// Filters are the topic filters subscribed on every connection. A
	// shared subscription, "$share/GROUP/FILTER", spreads the messages of
	// FILTER over the sessions subscribed with the same GROUP: one
	// consumer group. Required.
	Filters []string
	// QoS is the subscriptions' maximum QoS, 1 or 2. Zero means 1. A
	// message published at QoS 2 is acknowledged with PUBREC after the
	// commit; the broker's exactly-once ends there, the claim is what makes
	// the effect happen once.
	QoS byte
	// SessionExpiry is how long the broker keeps the session after a
	// connection ends, at least a second. Zero means DefaultSessionExpiry.
	SessionExpiry time.Duration
	// KeepAlive is the MQTT keep-alive. Zero means DefaultKeepAlive.
	KeepAlive time.Duration
	// Username and Password, when set, are sent in CONNECT.
	Username string
	Password []byte
}

// check validates s, with its defaults set.
func (s *Session) check() error {
	switch {
	case s.Dial == nil:
		return errors.New("mqtt: Run: Session.Dial is nil")
	case s.ClientID == "":
		return errors.New("mqtt: Run: Session.ClientID is empty: a persistent session needs a stable client id")
	case len(s.Filters) == 0:
		return errors.New("mqtt: Run: Session.Filters is empty")
	}
	for _, f := range s.Filters {
		if f == "" {
			return errors.New("mqtt: Run: an empty topic filter in Session.Filters")
		}
	}
	if s.QoS == 0 {
		s.QoS = 1
	}
	if s.QoS > 2 {
		return fmt.Errorf("mqtt: Run: Session.QoS %d, want 1 or 2", s.QoS)
	}
	if s.SessionExpiry == 0 {
		s.SessionExpiry = DefaultSessionExpiry
	}
	if s.SessionExpiry < time.Second || s.SessionExpiry.Seconds() > float64(^uint32(0)) {
		return fmt.Errorf("mqtt: Run: Session.SessionExpiry %v, want a second to %d seconds", s.SessionExpiry, ^uint32(0))
	}
	if s.KeepAlive == 0 {
		s.KeepAlive = DefaultKeepAlive
	}
	if s.KeepAlive < time.Second || s.KeepAlive.Seconds() > 65535 {
		return fmt.Errorf("mqtt: Run: Session.KeepAlive %v, want a second to 65535 seconds", s.KeepAlive)
	}
	return nil
}

// ErrRefused is what Run returns when the broker refuses the session for
// good: CONNECT or SUBSCRIBE answered with a reason code that another try
// would get again (not authorized, a bad client id, shared subscriptions
// not supported), or a subscription granted at QoS 0, under which a lost
// message would never come again.
var ErrRefused = errors.New("mqtt: refused by the broker")

// Run connects with s and consumes until ctx ends or the broker refuses the
// session (an error matching ErrRefused). A lost connection is dialled
// again, after the retry delay, with the same session: the broker then
// sends again what had not been acknowledged, and the claims find what was
// already applied (Duplicate). Each failed or lost connection is reported
// as adapter.EventFetchError.
//
// When ctx ends, Run shuts down gracefully: it takes no more messages, lets
// in-flight ones finish — with a context that is not cancelled, for up to
// the shutdown timeout — and acknowledges them, leaves unacknowledged a
// message waiting for its retry and those received as ctx ended
// (EventReleased): the broker keeps them in the session for its next
// connection. It then disconnects (keeping the session) and returns nil.
// A panic in the handler is not recovered.
func (c *Consumer) Run(ctx context.Context, s Session) error {
	if err := s.check(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout(), hcancel) })
	defer stopTimer()

	window := max(16, 2*c.cfg.Workers()*c.cfg.batchSize)
	r := &run{c: c, s: s, stopping: ctx, queue: make(chan delivery, min(window, 65535))}
	var wg sync.WaitGroup
	for range c.cfg.Workers() {
		wg.Go(func() { r.work(hctx) })
	}
	err := r.connectLoop(ctx)
	wg.Wait()
	r.finish(hctx)
	return err
}

// delivery is one received message and the connection it came on, whose
// client acknowledges it.
type delivery struct {
	pub *paho.Publish
	cli *paho.Client
	msg idempotent.Message // key and event time, as far as they could be read
}

// run is one Run's state.
type run struct {
	c        *Consumer
	s        Session
	stopping context.Context // ends when Run stops taking messages
	queue    chan delivery

	mu  sync.Mutex
	cli *paho.Client // the current connection's, nil between connections
}

// connectLoop keeps a connection up until r.stopping ends (nil) or the
// broker refuses the session (an error).
func (r *run) connectLoop(ctx context.Context) error {
	attempt := 0
	for ctx.Err() == nil {
		cli, err := r.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrRefused) {
				return err
			}
			attempt++
			r.c.events.Observe(ctx, adapter.Event{Type: adapter.EventFetchError, Source: r.s.ClientID, Attempt: attempt, Err: err})
			r.wait(r.c.rule.Delay(attempt))
			continue
		}
		attempt = 0
		select {
		case <-ctx.Done():
			return nil
		case <-cli.Done():
			r.setClient(nil)
			r.c.events.Observe(ctx, adapter.Event{Type: adapter.EventFetchError, Source: r.s.ClientID,
				Err: errors.New("mqtt: connection lost; the session resumes on the next")})
		}
	}
	return nil
}

func (r *run) setClient(cli *paho.Client) {
	r.mu.Lock()
	r.cli = cli
	r.mu.Unlock()
}

// wait waits d, or until the Run stops taking messages; it reports whether
// the whole d passed.
func (r *run) wait(d time.Duration) bool {
	if d <= 0 {
		return r.stopping.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.stopping.Done():
		return false
	}
}

// refusal reports whether reason code rc, in CONNACK or SUBACK, will not
// change on another try.
func refusal(rc byte) bool {
	switch rc {
	case 0x84, 0x85, 0x86, 0x87, 0x8C, // protocol version, client id, user name or password, not authorized, authentication method
		0x8F, 0x9E, 0xA1, 0xA2: // topic filter invalid, shared subscriptions, subscription identifiers, wildcard subscriptions not supported
		return true
	}
	return false
}

// connect dials, connects the session and subscribes its filters.
func (r *run) connect(ctx context.Context) (*paho.Client, error) {
	s := r.s
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := s.Dial(cctx)
	if err != nil {
		return nil, fmt.Errorf("mqtt: dial: %w", err)
	}
	if _, ok := conn.(sync.Locker); !ok {
		// paho writes one packet in several Writes where the connection
		// cannot take a vector (a TLS or wrapped connection), and writes
		// from more than one goroutine (acknowledgements beside SUBSCRIBE):
		// the lock keeps each packet whole.
		conn = packets.NewThreadSafeConn(conn)
	}
	cli := paho.NewClient(paho.ClientConfig{
		ClientID:                   s.ClientID,
		Conn:                       conn,
		EnableManualAcknowledgment: true,
		SendAcksInterval:           ackInterval,
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){r.receive},
	})
	expiry := uint32(s.SessionExpiry / time.Second)
	window := uint16(cap(r.queue))
	ca, err := cli.Connect(cctx, &paho.Connect{
		ClientID:     s.ClientID,
		CleanStart:   false,
		KeepAlive:    uint16(s.KeepAlive / time.Second),
		Username:     s.Username,
		UsernameFlag: s.Username != "",
		Password:     s.Password,
		PasswordFlag: s.Password != nil,
		Properties:   &paho.ConnectProperties{SessionExpiryInterval: &expiry, ReceiveMaximum: &window},
	})
	if err != nil {
		_ = conn.Close()
		if ca != nil && refusal(ca.ReasonCode) {
			return nil, fmt.Errorf("%w: CONNECT %s: reason code 0x%02X: %w", ErrRefused, s.ClientID, ca.ReasonCode, err)
		}
		return nil, fmt.Errorf("mqtt: connect %s: %w", s.ClientID, err)
	}
	subs := make([]paho.SubscribeOptions, len(s.Filters))
	for i, f := range s.Filters {
		subs[i] = paho.SubscribeOptions{Topic: f, QoS: s.QoS}
	}
	sa, err := cli.Subscribe(cctx, &paho.Subscribe{Subscriptions: subs})
	if err != nil {
		_ = cli.Disconnect(&paho.Disconnect{})
		if sa != nil {
			for _, rc := range sa.Reasons {
				if refusal(rc) {
					return nil, fmt.Errorf("%w: SUBSCRIBE %v: reason code 0x%02X: %w", ErrRefused, s.Filters, rc, err)
				}
			}
		}
		return nil, fmt.Errorf("mqtt: subscribe %v: %w", s.Filters, err)
	}
	for i, rc := range sa.Reasons {
		if rc == 0 {
			_ = cli.Disconnect(&paho.Disconnect{})
			return nil, fmt.Errorf("%w: SUBSCRIBE %q granted at QoS 0, where a lost message never comes again", ErrRefused, s.Filters[i])
		}
	}
	r.setClient(cli)
	return cli, nil
}

// receive is paho's callback for each PUBLISH: it hands the message to the
// workers, or, once the Run stops taking messages, leaves it
// unacknowledged for the session's next connection.
func (r *run) receive(pr paho.PublishReceived) (bool, error) {
	d := delivery{pub: pr.Packet, cli: pr.Client}
	d.msg, _ = r.c.cfg.Message(d.pub)
	if r.stopping.Err() == nil {
		select {
		case r.queue <- d:
			return true, nil
		case <-r.stopping.Done():
		}
	}
	r.release(context.Background(), d)
	return true, nil
}

// release reports d handed back unprocessed: it stays unacknowledged, and
// the broker sends it again on the session's next connection.
func (r *run) release(ctx context.Context, d delivery) {
	r.c.events.Observe(ctx, adapter.Event{Type: adapter.EventReleased, Message: d.msg, Source: d.pub.Topic, Detail: d.pub})
}

// finish ends a stopping Run: the queued messages are released, the
// acknowledgements given a moment to go out (paho sends them every
// ackInterval, in order; one lost here only makes a Duplicate), and the
// connection ended with DISCONNECT, keeping the session.
func (r *run) finish(ctx context.Context) {
	r.mu.Lock()
	cli := r.cli
	r.cli = nil
	r.mu.Unlock()
	if cli != nil {
		t := time.NewTimer(3 * ackInterval)
		select {
		case <-t.C:
		case <-cli.Done():
		}
		t.Stop()
		_ = cli.Disconnect(&paho.Disconnect{ReasonCode: 0})
	}
	for {
		select {
		case d := <-r.queue:
			r.release(ctx, d)
		default:
			return
		}
	}
}

// work takes messages until the Run stops taking them.
func (r *run) work(ctx context.Context) {
	for {
		select {
		case <-r.stopping.Done():
			return
		case d := <-r.queue:
			ds := []delivery{d}
			if r.c.batch != nil {
				ds = r.collect(ds)
			}
			r.handle(ctx, ds)
		}
	}
}

// collect adds to ds what arrives within the batch wait of each, up to the
// batch size.
func (r *run) collect(ds []delivery) []delivery {
	for len(ds) < r.c.cfg.batchSize {
		select {
		case d := <-r.queue:
			ds = append(ds, d)
			continue
		default:
		}
		t := time.NewTimer(r.c.cfg.batchWait)
		select {
		case d := <-r.queue:
			t.Stop()
			ds = append(ds, d)
		case <-t.C:
			return ds
		case <-r.stopping.Done():
			t.Stop()
			return ds
		}
	}
	return ds
}

// handle processes ds (one message, or a batch) until each is acknowledged
// or dead-lettered, retrying the ones the rule requeues after their delay
// (MQTT has no negative acknowledgement), or until the Run stops taking
// messages: then a message waiting for its retry stays unacknowledged, for
// the session's next connection.
func (r *run) handle(ctx context.Context, ds []delivery) {
	c := r.c
	for attempt := 1; len(ds) > 0; attempt++ {
		var res []adapter.Result
		if c.batch != nil {
			res = r.processBatch(ctx, ds)
		} else {
			res = []adapter.Result{r.processOne(ctx, ds[0])}
		}
		var again []delivery
		var wait time.Duration
		for i, d := range ds {
			err := res[i].Err
			dec := c.rule.Settle(d.msg, err, attempt)
			ev := adapter.Event{Message: d.msg, Source: d.pub.Topic, Attempt: attempt, Detail: d.pub}
			switch dec.Action {
			case adapter.Ack, adapter.DeadLetter:
				ev.Type = adapter.EventApplied
				switch {
				case dec.Action == adapter.DeadLetter:
					ev.Type, ev.Err = adapter.EventDeadLettered, err
				case res[i].Outcome == idempotent.Duplicate:
					ev.Type = adapter.EventDuplicate
				}
				if aerr := d.cli.Ack(d.pub); aerr != nil {
					c.events.Observe(ctx, adapter.Event{Type: adapter.EventSettleFailed, Message: d.msg, Source: d.pub.Topic,
						Err: fmt.Errorf("mqtt: acknowledge: %w", aerr), Detail: d.pub})
				}
			default:
				ev.Type, ev.Err, ev.Delay = adapter.EventRequeued, err, dec.Delay
				again = append(again, d)
				wait = max(wait, dec.Delay)
			}
			c.events.Observe(ctx, ev)
		}
		if len(again) == 0 || !r.wait(wait) {
			return
		}
		ds = again
	}
}

// processOne claims d and runs the handler if the claim is new.
func (r *run) processOne(ctx context.Context, d delivery) adapter.Result {
	c := r.c
	msg, err := c.cfg.Message(d.pub)
	tctx, end := c.cfg.StartTrace(ctx, d.pub, msg)
	var out idempotent.Outcome
	if err == nil {
		out, err = c.mw.ProcessMessage(tctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			return c.handle(ctx, tx, d.pub)
		})
	}
	end(out, err)
	return adapter.Result{Outcome: out, Err: err}
}

// processBatch claims ds in one transaction and runs the batch handler
// with the fresh ones (adapter.ProcessBatch).
func (r *run) processBatch(ctx context.Context, ds []delivery) []adapter.Result {
	pubs := make([]*paho.Publish, len(ds))
	claims := make([]idempotent.Message, len(ds))
	errs := make([]error, len(ds))
	for i, d := range ds {
		pubs[i] = d.pub
		claims[i], errs[i] = r.c.cfg.Message(d.pub)
	}
	tctx, end := r.c.cfg.StartBatchTrace(ctx, pubs, claims)
	res := adapter.ProcessBatch[*paho.Publish](tctx, r.c.mw, pubs, claims, errs, r.c.batch)
	end(res)
	return res
}
