package nats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/dialect"
)

// Action is how a Consumer settled a message.
type Action int

const (
	// Acked: the handler succeeded (the effect committed, or was found
	// applied before), and the message was acked with DoubleAck.
	Acked Action = iota + 1
	// Naked: the handler failed with an error the settle rule requeues;
	// the message was naked with a redelivery delay (see WithNakDelay).
	Naked
	// Terminated: the handler failed with an error the settle rule (or a
	// poison predicate) makes poison; the message was terminated (Term),
	// and the server will not redeliver it.
	Terminated
	// Released: the message arrived while Run was shutting down and was
	// naked without delay, without running the handler.
	Released
)

// String returns the action's name: "acked", "naked", "terminated" or
// "released".
func (a Action) String() string {
	switch a {
	case Acked:
		return "acked"
	case Naked:
		return "naked"
	case Terminated:
		return "terminated"
	case Released:
		return "released"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Settlement describes how one message was settled; see WithOnSettle.
type Settlement struct {
	// Msg is the message.
	Msg jetstream.Msg
	// Action is what the Consumer told the server.
	Action Action
	// Outcome is the handler's outcome when Action is Acked.
	Outcome idempotent.Outcome
	// Err is the handler's error when Action is Naked or Terminated.
	Err error
	// Delay is the redelivery delay when Action is Naked.
	Delay time.Duration
	// SettleErr is the error from sending the ack, nak or term — the
	// connection dropped, or the server did not confirm the DoubleAck in
	// time. The server will redeliver the message after AckWait (and, if
	// the effect committed, the claim will make it a duplicate).
	SettleErr error
}

// Stats counts what a Consumer did, over all its Runs.
type Stats struct {
	// Delivered is how many messages were handed to the handler.
	Delivered int64
	// Applied and Duplicates count the handler's successful outcomes.
	Applied, Duplicates int64
	// Acked, Naked, Terminated and Released count messages the server was
	// told about successfully, by action.
	Acked, Naked, Terminated, Released int64
	// SettleFailed counts acks, naks and terms that could not be sent.
	SettleFailed int64
	// InProgress counts the "work in progress" signals sent for handlers
	// running longer than half the consumer's AckWait.
	InProgress int64
	// FetchErrors counts pull requests that failed and were retried.
	FetchErrors int64
}

type counters struct {
	delivered, applied, duplicates                   atomic.Int64
	acked, naked, terminated, released, settleFailed atomic.Int64
	inProgress, fetchErrors                          atomic.Int64
}

// Consumer pulls messages from a durable JetStream consumer and settles
// every message after its handler returns. It is safe for concurrent use;
// Run may be called again, or on several JetStream consumers at once.
type Consumer struct {
	handle    Handler
	batch     BatchHandler
	batchSize int
	cfg       config
	stats     counters
}

// NewConsumer returns a per-message Consumer: each message is handled by h
// (usually built with Process or Decode), in a transaction of its own. It
// sends nothing to the server; Run does.
func NewConsumer(h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("nats: NewConsumer: nil handler")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.fetchSize == 0 {
		cfg.fetchSize = 8
	}
	return &Consumer{handle: h, cfg: cfg}, nil
}

// NewBatchConsumer returns a batch Consumer: each worker fetches up to size
// messages (waiting at most the fetch wait for the batch to fill) and hands
// them to h (usually built with ProcessBatch or DecodeBatch) at once, so a
// batch's claims and effects commit in one transaction. size must be 1 to
// MaxFetch. It sends nothing to the server; Run does.
func NewBatchConsumer(size int, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("nats: NewBatchConsumer: nil handler")
	}
	if size < 1 || size > MaxFetch {
		return nil, fmt.Errorf("nats: NewBatchConsumer: batch size %d, want 1 to %d", size, MaxFetch)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.fetchSize != 0 {
		return nil, errors.New("nats: NewBatchConsumer: WithFetchSize is for NewConsumer; the batch size sets the fetch size")
	}
	cfg.fetchSize = size
	return &Consumer{batch: h, batchSize: size, cfg: cfg}, nil
}

func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return cfg, errors.New("nats: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// NewMiddleware returns an idempotent.Middleware whose consumer name is the
// durable name of cons, so that the claims of one JetStream consumer are
// kept under its own name. Pass idempotent.New another name instead when
// several durables must share claims (a consumer renamed, say). opts are
// idempotent's options.
func NewMiddleware(db *sql.DB, d dialect.Dialect, cons jetstream.Consumer, opts ...idempotent.Option) (*idempotent.Middleware, error) {
	if cons == nil {
		return nil, errors.New("nats: NewMiddleware: nil consumer")
	}
	info := cons.CachedInfo()
	if info == nil || info.Config.Durable == "" {
		return nil, fmt.Errorf("%w: NewMiddleware needs a durable name", ErrNotDurable)
	}
	return idempotent.New(db, d, info.Config.Durable, opts...)
}

// Stats returns the counts so far.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Acked: s.acked.Load(), Naked: s.naked.Load(), Terminated: s.terminated.Load(),
		Released: s.released.Load(), SettleFailed: s.settleFailed.Load(),
		InProgress: s.inProgress.Load(), FetchErrors: s.fetchErrors.Load(),
	}
}

// Run pulls from cons — a durable pull consumer with AckExplicit, created
// with jetstream.Stream.CreateOrUpdateConsumer, say — until ctx ends or the
// consumer or connection goes away. It runs the configured number of
// workers, each with its own pull requests (see the package documentation
// for how messages are settled).
//
// When ctx ends, Run shuts down gracefully: it sends no new pull requests,
// lets in-flight messages finish — with a context that is not cancelled, for
// up to the shutdown timeout — and acks them, naks (without delay) messages
// that arrive for the open pull requests before they expire, and returns nil.
//
// Failed pull requests while the cluster elects a leader, or while the
// connection reconnects, are retried with backoff. Run returns an error
// matching ErrConnectionClosed when the connection was closed, and one
// matching ErrConsumerGone when the consumer or its stream was deleted;
// in-flight handlers finish first (their acks may fail: those messages are
// redelivered, and the claims make them duplicates). A panic in the handler
// is not recovered.
func (c *Consumer) Run(ctx context.Context, cons jetstream.Consumer) error {
	if cons == nil {
		return errors.New("nats: Run: nil consumer")
	}
	info := cons.CachedInfo()
	if info == nil {
		return fmt.Errorf("%w: no consumer info", ErrNotDurable)
	}
	if info.Config.Durable == "" || info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("%w: consumer %q on stream %q has durable name %q and ack policy %v",
			ErrNotDurable, info.Name, info.Stream, info.Config.Durable, info.Config.AckPolicy)
	}
	if ctx.Err() != nil {
		return nil
	}
	ackWait := info.Config.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}

	// Handlers run with a context that outlives ctx, so that a shutdown
	// lets in-flight transactions commit; it ends after the shutdown
	// timeout, or when Run returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.shutdownTimeout, hcancel) })
	defer stopTimer()
	// pulling ends with ctx, or when a worker meets a fatal error.
	pulling, stop := context.WithCancel(ctx)
	defer stop()

	w := worker{c: c, cons: cons, name: info.Name, stream: info.Stream, ackWait: ackWait}
	var mu sync.Mutex
	var fatal error
	var wg sync.WaitGroup
	for range c.cfg.workers {
		wg.Go(func() {
			if err := w.run(pulling, hctx); err != nil {
				mu.Lock()
				if fatal == nil {
					fatal = err
				}
				mu.Unlock()
				stop()
			}
		})
	}
	wg.Wait()
	return fatal
}

func (c *Consumer) isPoison(err error) bool {
	if IsPoison(err) {
		return true
	}
	for _, p := range c.cfg.poison {
		if p(err) {
			return true
		}
	}
	return false
}

// worker is one pulling goroutine's view of a Run.
type worker struct {
	c            *Consumer
	cons         jetstream.Consumer
	name, stream string
	ackWait      time.Duration
}

// run pulls until pulling ends (nil) or the consumer or connection goes away
// (an error). hctx is the handlers' context.
func (w worker) run(pulling, hctx context.Context) error {
	c := w.c
	backoff := time.Duration(0)
	gone := 0
	lastCheck := time.Now()
	for pulling.Err() == nil {
		received := 0
		batch, err := w.cons.Fetch(c.cfg.fetchSize, jetstream.FetchMaxWait(c.cfg.fetchWait))
		if err == nil {
			if c.batch != nil {
				var msgs []jetstream.Msg
				for m := range batch.Messages() {
					msgs = append(msgs, m)
				}
				received = len(msgs)
				if len(msgs) > 0 {
					if pulling.Err() != nil {
						for _, m := range msgs {
							c.settle(hctx, Settlement{Msg: m, Action: Released}, m.Nak())
						}
					} else {
						w.handleBatch(hctx, msgs)
					}
				}
			} else {
				for m := range batch.Messages() {
					received++
					if pulling.Err() != nil {
						c.settle(hctx, Settlement{Msg: m, Action: Released}, m.Nak())
						continue
					}
					w.handleOne(hctx, m)
				}
			}
			err = batch.Error()
		}
		if err == nil || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, natsgo.ErrTimeout) {
			backoff = 0
			if received > 0 {
				gone = 0
				continue
			}
			// A pull request to a consumer that no longer exists expires
			// unanswered, like an idle one: ask the server now and then.
			if time.Since(lastCheck) < time.Second {
				continue
			}
			lastCheck = time.Now()
			if ferr := w.fatal(pulling, err, &gone); ferr != nil {
				return ferr
			}
			continue
		}
		if ferr := w.fatal(pulling, err, &gone); ferr != nil {
			return ferr
		}
		if pulling.Err() != nil {
			return nil
		}
		c.stats.fetchErrors.Add(1)
		if c.cfg.onFetchError != nil {
			c.cfg.onFetchError(err)
		}
		backoff = min(max(2*backoff, 20*time.Millisecond), 2*time.Second)
		t := time.NewTimer(backoff)
		select {
		case <-pulling.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// fatal returns the error Run should end with for a failed pull request, or
// nil when it is worth retrying. gone counts consecutive verdicts that the
// consumer does not exist: the server says so for a moment while a cluster
// recovers, so it takes three in a row.
func (w worker) fatal(pulling context.Context, err error, gone *int) error {
	if isClosed(err) {
		return fmt.Errorf("%w: consumer %q on stream %q: %w", ErrConnectionClosed, w.name, w.stream, err)
	}
	if pulling.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(pulling, 2*time.Second)
	defer cancel()
	_, ierr := w.cons.Info(ctx)
	switch {
	case ierr == nil:
		*gone = 0
		return nil
	case isClosed(ierr):
		return fmt.Errorf("%w: consumer %q on stream %q: %w", ErrConnectionClosed, w.name, w.stream, ierr)
	case errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(ierr, jetstream.ErrStreamNotFound):
		if *gone++; *gone >= 3 || errors.Is(err, jetstream.ErrConsumerDeleted) {
			return fmt.Errorf("%w: consumer %q on stream %q: %w", ErrConsumerGone, w.name, w.stream, ierr)
		}
	}
	return nil
}

func isClosed(err error) bool {
	return errors.Is(err, natsgo.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConnectionClosed)
}

// heartbeat sends InProgress for msgs every half AckWait until stop is
// called, so that the server does not redeliver messages whose handler is
// still running.
func (w worker) heartbeat(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(w.ackWait / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					if m.InProgress() == nil {
						w.c.stats.inProgress.Add(1)
					}
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// handleOne runs the handler for one message and settles it.
func (w worker) handleOne(ctx context.Context, m jetstream.Msg) {
	c := w.c
	c.stats.delivered.Add(1)
	stop := w.heartbeat([]jetstream.Msg{m})
	outcome, err := c.handle(ctx, m)
	stop()
	c.settleResult(ctx, m, outcome, err)
}

// handleBatch runs the batch handler and settles every message of the
// batch; acks go out concurrently.
func (w worker) handleBatch(ctx context.Context, msgs []jetstream.Msg) {
	c := w.c
	c.stats.delivered.Add(int64(len(msgs)))
	stop := w.heartbeat(msgs)
	outcomes, errs := c.batch(ctx, msgs)
	stop()
	if len(outcomes) != len(msgs) || len(errs) != len(msgs) {
		err := fmt.Errorf("nats: batch handler returned %d outcomes and %d errors for %d messages", len(outcomes), len(errs), len(msgs))
		outcomes, errs = make([]idempotent.Outcome, len(msgs)), make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
	}
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() { c.settleResult(ctx, m, outcomes[i], errs[i]) })
	}
	wg.Wait()
}

// settleResult acks, naks or terminates m after its handler returned, as
// the settle rule decides.
func (c *Consumer) settleResult(ctx context.Context, m jetstream.Msg, outcome idempotent.Outcome, err error) {
	d := c.decide(m, err)
	switch d.Action {
	case adapter.Ack:
		switch outcome {
		case idempotent.Applied:
			c.stats.applied.Add(1)
		case idempotent.Duplicate:
			c.stats.duplicates.Add(1)
		}
		c.settle(ctx, Settlement{Msg: m, Action: Acked, Outcome: outcome}, m.DoubleAck(ctx))
	case adapter.DeadLetter:
		c.settle(ctx, Settlement{Msg: m, Action: Terminated, Err: err}, m.Term())
	default:
		c.settle(ctx, Settlement{Msg: m, Action: Naked, Err: err, Delay: d.Delay}, m.NakWithDelay(d.Delay))
	}
}

// decide is adapter.Rule.Settle for m's delivery: with the Middleware's
// clock and the message's event time when a handler of this package
// failed, and the attempt from the server's delivery count. An error the
// rule would requeue is poison when a poison predicate says so.
func (c *Consumer) decide(m jetstream.Msg, err error) adapter.Decision {
	rule := adapter.Rule{Backoff: c.cfg.backoff}
	var msg idempotent.Message
	if ce := (*claimError)(nil); errors.As(err, &ce) {
		rule, msg = adapter.RuleFor(ce.mw, c.cfg.backoff), ce.msg
	}
	attempt := 1
	if md, merr := m.Metadata(); merr == nil && md.NumDelivered > 0 {
		attempt = int(min(md.NumDelivered, 1<<20))
	}
	d := rule.Settle(msg, err, attempt)
	if d.Action == adapter.Requeue && c.isPoison(err) {
		d = adapter.Decision{Action: adapter.DeadLetter, Err: err}
	}
	return d
}

func (c *Consumer) settle(ctx context.Context, s Settlement, settleErr error) {
	s.SettleErr = settleErr
	if settleErr != nil {
		c.stats.settleFailed.Add(1)
	} else {
		switch s.Action {
		case Acked:
			c.stats.acked.Add(1)
		case Naked:
			c.stats.naked.Add(1)
		case Terminated:
			c.stats.terminated.Add(1)
		case Released:
			c.stats.released.Add(1)
		}
	}
	if c.cfg.onSettle != nil {
		c.cfg.onSettle(ctx, s)
	}
}
