package nats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Consumer pulls messages from a durable JetStream consumer, claims each
// through an idempotent.Middleware, runs its handler for a new claim in
// the claim's transaction, and settles every message after the
// transaction has ended, by adapter.Rule.Settle. It is safe for
// concurrent use; Run may be called again, or on several JetStream
// consumers at once.
type Consumer struct {
	mw     *idempotent.Middleware
	handle Handler      // per-message mode
	batch  BatchHandler // batch mode
	cfg    config
	rule   adapter.Rule
	events adapter.Counter      // counts, then tells the Observer
	dead   *adapter.DeadLetters // with WithDeadLetter
}

// NewConsumer returns a per-message Consumer: each message is claimed
// through mw and, when its claim is new, handled by h (often built with
// Decode) in the claim's transaction, one transaction per message. It
// fails if mw or h is nil, an option is invalid, or mw is in partitioned
// mode and the options leave it without a producer's event time
// (adapter.ErrNoProducerEventTime). It sends nothing to the server; Run
// does.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("nats: NewConsumer: nil handler")
	}
	cfg, err := newConfig("NewConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if cfg.batchSize != 0 {
		return nil, errors.New("nats: NewConsumer: WithBatchSize is for NewBatchConsumer; WithFetchSize sets how many messages a pull request asks for")
	}
	if cfg.fetchSize == 0 {
		cfg.fetchSize = DefaultFetchSize
	}
	return newConsumer(mw, cfg, h, nil)
}

// NewBatchConsumer returns a batch Consumer: each worker fetches up to the
// batch size of messages (WithBatchSize; waiting at most the fetch wait for
// the batch to fill), claims them all in one transaction with
// mw.ProcessMessages, and hands h the fresh ones, so a batch's claims and
// effects commit together. Each message is then settled on its own, as the
// rule says. It fails as NewConsumer does. It sends nothing to the server;
// Run does.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("nats: NewBatchConsumer: nil handler")
	}
	cfg, err := newConfig("NewBatchConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if cfg.fetchSize != 0 {
		return nil, errors.New("nats: NewBatchConsumer: WithFetchSize is for NewConsumer; WithBatchSize sets how many messages a pull request asks for")
	}
	if cfg.batchSize == 0 {
		cfg.batchSize = DefaultBatchSize
	}
	cfg.fetchSize = cfg.batchSize
	return newConsumer(mw, cfg, nil, h)
}

func newConsumer(mw *idempotent.Middleware, cfg config, h Handler, b BatchHandler) (*Consumer, error) {
	c := &Consumer{mw: mw, handle: h, batch: b, cfg: cfg, rule: cfg.Rule()}
	c.events.Next = cfg.Observer()
	if cfg.deadLetter != nil {
		dead, err := adapter.NewDeadLetters("nats", mw, cfg.deadLetter, DeadLetterKind)
		if err != nil {
			return nil, err
		}
		c.dead = dead
	}
	return c, nil
}

// Stats returns the counts of the Consumer's events so far, over all its
// Runs: every message it finished is in exactly one of Applied, Duplicates
// and DeadLettered; Requeued counts naks (a message counted again when it
// comes back), Released the messages handed back at shutdown.
func (c *Consumer) Stats() adapter.Stats { return c.events.Stats() }

// Run pulls from cons — a durable pull consumer with AckExplicit, created
// with jetstream.Stream.CreateOrUpdateConsumer, say — until ctx ends or the
// consumer or connection goes away. It runs the configured number of
// workers, each with its own pull requests (see the package documentation
// for how messages are settled).
//
// When ctx ends, Run shuts down gracefully: it sends no new pull requests,
// lets in-flight messages finish — with a context that is not cancelled,
// for up to the shutdown timeout — and acks them, naks (without delay)
// messages that arrive for the open pull requests before they expire
// (EventReleased), and returns nil.
//
// Failed pull requests while the cluster elects a leader, or while the
// connection reconnects, are retried with backoff (EventFetchError). Run
// returns an error matching ErrConnectionClosed when the connection was
// closed, and one matching ErrConsumerGone when the consumer or its stream
// was deleted; in-flight handlers finish first (their acks may fail: those
// messages are redelivered, and the claims make them duplicates). A panic
// in the handler is not recovered.
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
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout(), hcancel) })
	defer stopTimer()
	// pulling ends with ctx, or when a worker meets a fatal error.
	pulling, stop := context.WithCancel(ctx)
	defer stop()

	w := worker{c: c, cons: cons, name: info.Name, stream: info.Stream, ackWait: ackWait, source: info.Stream + "/" + info.Name}
	if c.batch == nil && c.cfg.Routed() {
		return w.routed(pulling, hctx)
	}
	var mu sync.Mutex
	var fatal error
	var wg sync.WaitGroup
	for range c.cfg.Workers() {
		wg.Go(func() {
			if err := w.run(pulling, hctx, nil); err != nil {
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

// worker is one pulling goroutine's view of a Run.
type worker struct {
	c            *Consumer
	cons         jetstream.Consumer
	name, stream string
	source       string // "<stream>/<consumer>"
	ackWait      time.Duration
}

// routed is Run with ordering (adapter.Config.Routed): one goroutine pulls
// and hands each message to the worker of its ordering key, so that one
// entity's messages are handled one after another, in the stream's order,
// and need not park, while other entities' run on the other workers.
func (w worker) routed(pulling, hctx context.Context) error {
	in := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for _, msgs := range w.c.cfg.Route(in) {
		wg.Go(func() {
			var settling chan struct{}
			for m := range msgs {
				if pulling.Err() != nil {
					w.release(hctx, m)
					continue
				}
				w.handleOne(hctx, m, &settling)
			}
			if settling != nil {
				<-settling
			}
		})
	}
	err := w.run(pulling, hctx, func(m jetstream.Msg) { in <- m })
	close(in)
	wg.Wait()
	return err
}

// run pulls until pulling ends (nil) or the consumer or connection goes
// away (an error). hctx is the handlers' context. dispatch, when not nil,
// takes each message of a per-message consumer instead of the worker.
func (w worker) run(pulling, hctx context.Context, dispatch func(jetstream.Msg)) error {
	c := w.c
	backoff := time.Duration(0)
	gone := 0
	lastCheck := time.Now()
	// settling is the settle of the worker's last message, still running
	// (see handleOne); the worker returns once it has finished.
	var settling chan struct{}
	defer func() {
		if settling != nil {
			<-settling
		}
	}()
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
							w.release(hctx, m)
						}
					} else {
						w.handleBatch(hctx, msgs)
					}
				}
			} else {
				for m := range batch.Messages() {
					received++
					if pulling.Err() != nil {
						w.release(hctx, m)
						continue
					}
					if dispatch != nil {
						dispatch(m)
						continue
					}
					w.handleOne(hctx, m, &settling)
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
		c.events.Observe(hctx, adapter.Event{Type: adapter.EventFetchError, Source: w.source,
			Err: fmt.Errorf("nats: pull request to %s: %w", w.source, err)})
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

// fatal returns the error Run should end with for a failed pull request,
// or nil when it is worth retrying. gone counts consecutive verdicts that
// the consumer does not exist: the server says so for a moment while a
// cluster recovers, so it takes three in a row.
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
					_ = m.InProgress() // a lost one: the message comes again, a duplicate
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// delivery is what a worker knows of one delivery of a message.
type delivery struct {
	m jetstream.Msg
	// msg is what the Middleware is given: the key and event time, as far
	// as they could be read.
	msg idempotent.Message
	// attempt is the server's delivery count, from 1.
	attempt int
	// source is "<stream>/<consumer>/<stream sequence>".
	source string
}

// read returns m's delivery, and the error of reading its key and event
// time (poison, for the rule).
func (w worker) read(m jetstream.Msg) (delivery, error) {
	d := delivery{m: m, attempt: 1, source: w.source}
	if md, err := m.Metadata(); err == nil {
		if md.NumDelivered > 0 {
			d.attempt = int(min(md.NumDelivered, 1<<20))
		}
		d.source += "/" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	var err error
	d.msg, err = w.c.cfg.Message(m)
	return d, err
}

// handleOne claims one message, runs the handler if the claim is new, and
// settles the message, after the transaction has ended, on a goroutine of
// its own: the worker goes on to the next message while the server
// confirms the ack (DoubleAck's round trip), instead of waiting for it.
// *settling is the previous message's settle; it must have finished before
// this one starts, so a worker has at most one settle in flight and
// settles its messages in order. A confirmation that never comes is an
// EventSettleFailed, as before, and the message's redelivery a duplicate.
func (w worker) handleOne(ctx context.Context, m jetstream.Msg, settling *chan struct{}) {
	c := w.c
	stop := w.heartbeat([]jetstream.Msg{m})
	d, err := w.read(m)
	tctx, end := c.cfg.StartTrace(ctx, m, d.msg)
	var out idempotent.Outcome
	if err == nil {
		out, err = c.cfg.Process(tctx, c.mw, m, d.msg, func(ctx context.Context, tx *sql.Tx) error {
			return c.handle(ctx, tx, m)
		})
	}
	end(out, err)
	stop()
	if *settling != nil {
		<-*settling
	}
	done := make(chan struct{})
	*settling = done
	go func() {
		defer close(done)
		w.settle(ctx, d, out, err)
	}()
}

// handleBatch claims the messages of one fetch in one transaction, runs
// the batch handler with the fresh ones, and settles every message on its
// own; acks go out concurrently. A message that cannot be claimed (its key
// or event time is poison, or the Middleware would refuse it) is set aside
// before the transaction; one the handler names with adapter.PoisonItem,
// or the Middleware with an idempotent.BatchKeyError, is set aside after
// it, and the rest run again without it.
func (w worker) handleBatch(ctx context.Context, msgs []jetstream.Msg) {
	c := w.c
	stop := w.heartbeat(msgs)
	ds := make([]delivery, len(msgs))
	claims := make([]idempotent.Message, len(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		ds[i], errs[i] = w.read(m)
		claims[i] = ds[i].msg
	}
	tctx, end := c.cfg.StartBatchTrace(ctx, msgs, claims)
	res := c.cfg.ProcessBatch(tctx, c.mw, msgs, claims, errs, c.batch)
	end(res)
	stop()
	var wg sync.WaitGroup
	for i := range msgs {
		wg.Go(func() { w.settle(ctx, ds[i], res[i].Outcome, res[i].Err) })
	}
	wg.Wait()
}

// settle acks, naks or terminates d's message as the settle rule decides
// for the Middleware's answer (out, err), then tells the Observer.
func (w worker) settle(ctx context.Context, d delivery, out idempotent.Outcome, err error) {
	dec := w.c.rule.Settle(d.msg, err, d.attempt)
	if dec.Action == adapter.DeadLetter && w.c.dead != nil {
		if derr := w.deadLetter(ctx, d, err); derr != nil {
			// The dead letter did not commit: deliver it again later.
			dec, err = adapter.Decision{Action: adapter.Requeue, Delay: w.c.rule.Delay(d.attempt), Err: derr}, derr
		}
	}
	e := adapter.Event{Message: d.msg, Source: d.source, Detail: d.m}
	var serr error
	switch dec.Action {
	case adapter.Ack:
		e.Type, e.Attempt = adapter.EventApplied, d.attempt
		if out == idempotent.Duplicate {
			e.Type = adapter.EventDuplicate
		}
		serr = d.m.DoubleAck(ctx)
	case adapter.Requeue:
		e.Type, e.Attempt, e.Delay, e.Err = adapter.EventRequeued, d.attempt, dec.Delay, err
		serr = d.m.NakWithDelay(dec.Delay)
	default:
		// Term, not TermWithReason: a server older than 2.10.4 ignores
		// the latter and would redeliver the message.
		e.Type, e.Err = adapter.EventDeadLettered, err
		serr = d.m.Term()
	}
	w.observe(ctx, e, dec.Action, serr)
}

// release naks m without delay and without running the handler: it
// arrived while Run was shutting down.
func (w worker) release(ctx context.Context, m jetstream.Msg) {
	d, _ := w.read(m)
	w.observe(ctx, adapter.Event{Type: adapter.EventReleased, Message: d.msg, Source: d.source, Detail: m}, adapter.Requeue, m.Nak())
}

// observe reports e, and an EventSettleFailed after it when telling the
// server of action failed with serr.
func (w worker) observe(ctx context.Context, e adapter.Event, action adapter.Action, serr error) {
	w.c.events.Observe(ctx, e)
	if serr != nil {
		w.c.events.Observe(ctx, adapter.Event{Type: adapter.EventSettleFailed, Message: e.Message, Source: e.Source, Attempt: e.Attempt,
			Err: fmt.Errorf("nats: %s of %s: %w", action, e.Source, serr), Detail: e.Detail})
	}
}
