package cdkpubsub

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Consumer receives messages from a gocloud.dev/pubsub Subscription, claims
// each through an idempotent.Middleware, runs its handler for a new claim
// in the claim's transaction, and settles every message after the
// transaction has ended, by adapter.Rule.Settle. It is safe for concurrent
// use; Run may be called again, or on several Subscriptions at once.
type Consumer struct {
	mw     *idempotent.Middleware
	handle Handler      // per-message mode
	batch  BatchHandler // batch mode
	cfg    config
	rule   adapter.Rule
	hold   time.Duration        // the longest a message is held before its requeue
	dead   *adapter.DeadLetters // nil without WithDeadLetter
	events adapter.Counter
}

// NewConsumer returns a per-message Consumer: each message is claimed
// through mw and, when its claim is new, handled by h (often built with
// Decode) in the claim's transaction, one transaction per message. It
// fails if mw or h is nil, an option is invalid, or mw is in partitioned
// mode and the options leave it without a producer's event time
// (adapter.ErrNoProducerEventTime). It receives nothing; Run does.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("cdkpubsub: NewConsumer: nil handler")
	}
	cfg, err := newConfig("NewConsumer", false, mw, opts)
	if err != nil {
		return nil, err
	}
	return newConsumer(mw, cfg, h, nil)
}

// NewBatchConsumer returns a batch Consumer: each worker collects up to the
// batch size of received messages (WithBatchSize; after the first, only
// those that arrive within the batch wait, WithBatchWait), claims them all
// in one transaction with mw.ProcessMessages, and hands h the fresh ones,
// so a batch's claims and effects commit together. Each message is then
// settled on its own, as the rule says. It fails as NewConsumer does. It
// receives nothing; Run does.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("cdkpubsub: NewBatchConsumer: nil handler")
	}
	cfg, err := newConfig("NewBatchConsumer", true, mw, opts)
	if err != nil {
		return nil, err
	}
	return newConsumer(mw, cfg, nil, h)
}

func newConsumer(mw *idempotent.Middleware, cfg config, h Handler, b BatchHandler) (*Consumer, error) {
	c := &Consumer{mw: mw, handle: h, batch: b, cfg: cfg, rule: cfg.Rule()}
	c.hold = c.rule.Backoff.MaxBackoff
	c.events.Next = cfg.Observer()
	if cfg.deadLetter != nil {
		dead, err := adapter.NewDeadLetters("cdkpubsub", mw, cfg.deadLetter, cfg.deadKind)
		if err != nil {
			return nil, err
		}
		c.dead = dead
	}
	return c, nil
}

// Stats returns the counts of the Consumer's events so far, over all its
// Runs: every message it finished is in exactly one of Applied, Duplicates
// and DeadLettered; Requeued counts messages handed back after a failure
// (a message counted again when it comes back), Released those handed back
// at shutdown unprocessed.
func (c *Consumer) Stats() adapter.Stats { return c.events.Stats() }

// Run receives from sub until ctx ends or sub fails. It runs the
// configured number of workers, each calling sub.Receive (see the package
// documentation for how messages are settled).
//
// When ctx ends, Run shuts down gracefully: it receives no more, lets
// in-flight messages finish — with a context that is not cancelled, for up
// to the shutdown timeout — and acks them, hands back at once a message
// held for its retry delay (EventRequeued) or received as ctx ended
// (EventReleased), and returns nil. Acks and nacks are sent in the
// background by gocloud.dev/pubsub: call sub.Shutdown after Run returns to
// flush them (a lost one only makes a duplicate).
//
// Run returns an error when sub.Receive fails for another reason than ctx
// — sub was shut down, or the driver reported an error it does not retry;
// in-flight handlers finish first. A panic in the handler is not
// recovered.
func (c *Consumer) Run(ctx context.Context, sub *pubsub.Subscription) error {
	if sub == nil {
		return errors.New("cdkpubsub: Run: nil subscription")
	}
	if ctx.Err() != nil {
		return nil
	}
	// Handlers run with a context that outlives ctx, so that a shutdown
	// lets in-flight transactions commit; it ends after the shutdown
	// timeout, or when Run returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout(), hcancel) })
	defer stopTimer()
	// receiving ends with ctx, or when a worker meets a fatal error.
	receiving, stop := context.WithCancel(ctx)
	defer stop()

	w := worker{c: c, sub: sub, receiving: receiving}
	if c.batch == nil && c.cfg.Routed() {
		err := w.routed(hctx)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var mu sync.Mutex
	var fatal error
	var wg sync.WaitGroup
	for range c.cfg.Workers() {
		wg.Go(func() {
			if err := w.run(hctx); err != nil {
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
	if ctx.Err() != nil {
		return nil
	}
	return fatal
}

// worker is one receiving goroutine's view of a Run.
type worker struct {
	c         *Consumer
	sub       *pubsub.Subscription
	receiving context.Context // ends when the Run stops receiving
}

// run receives until w.receiving ends (nil) or Receive fails (an error).
// hctx is the handlers' context.
func (w worker) run(hctx context.Context) error {
	c := w.c
	for w.receiving.Err() == nil {
		m, err := w.sub.Receive(w.receiving)
		if err != nil {
			if w.receiving.Err() != nil {
				return nil
			}
			return fmt.Errorf("cdkpubsub: receive: %w", err)
		}
		msgs := []*pubsub.Message{m}
		if c.batch != nil {
			msgs = w.collect(msgs)
		}
		if w.receiving.Err() != nil {
			for _, m := range msgs {
				w.release(hctx, m)
			}
			return nil
		}
		if c.batch != nil {
			w.handleBatch(hctx, msgs)
		} else {
			w.handleOne(hctx, m)
		}
	}
	return nil
}

// routed is Run with ordering (adapter.Config.Routed): one goroutine
// receives and hands each message to the worker of its ordering key, so
// that one entity's messages are handled one after another, in the order
// the subscription gave them, and need not park, while other entities'
// run on the other workers. It returns when receiving ends (nil) or
// Receive fails (an error), once the workers have finished.
func (w worker) routed(hctx context.Context) error {
	in := make(chan *pubsub.Message)
	var wg sync.WaitGroup
	for _, msgs := range w.c.cfg.Route(in) {
		wg.Go(func() {
			for m := range msgs {
				if w.receiving.Err() != nil {
					w.release(hctx, m)
					continue
				}
				w.handleOne(hctx, m)
			}
		})
	}
	var err error
	for w.receiving.Err() == nil {
		var m *pubsub.Message
		if m, err = w.sub.Receive(w.receiving); err != nil {
			if w.receiving.Err() != nil {
				err = nil
			} else {
				err = fmt.Errorf("cdkpubsub: receive: %w", err)
			}
			break
		}
		in <- m
	}
	close(in)
	wg.Wait()
	return err
}

// collect adds to msgs what the subscription gives within the batch wait
// of each, up to the batch size. A failed Receive ends the batch; the next
// one reports it.
func (w worker) collect(msgs []*pubsub.Message) []*pubsub.Message {
	for len(msgs) < w.c.cfg.batchSize {
		ctx, cancel := context.WithTimeout(w.receiving, w.c.cfg.batchWait)
		m, err := w.sub.Receive(ctx)
		cancel()
		if err != nil {
			break
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// delivery is what a worker knows of one delivery of a message.
type delivery struct {
	m *pubsub.Message
	// msg is what the Middleware is given: the key and event time, as far
	// as they could be read.
	msg idempotent.Message
}

// read returns m's delivery, and the error of reading its key and event
// time (poison, for the rule).
func (w worker) read(m *pubsub.Message) (delivery, error) {
	msg, err := w.c.cfg.Message(m)
	return delivery{m: m, msg: msg}, err
}

// handleOne claims one message, runs the handler if the claim is new, and
// settles the message.
func (w worker) handleOne(ctx context.Context, m *pubsub.Message) {
	c := w.c
	d, err := w.read(m)
	tctx, end := c.cfg.StartTrace(ctx, m, d.msg)
	var out idempotent.Outcome
	if err == nil {
		out, err = c.cfg.Process(tctx, c.mw, m, d.msg, func(ctx context.Context, tx *sql.Tx) error {
			return c.handle(ctx, tx, m)
		})
	}
	end(out, err)
	w.settle(ctx, []delivery{d}, []adapter.Result{{Outcome: out, Err: err}})
}

// handleBatch claims the messages of one batch in one transaction, runs
// the batch handler with the fresh ones, and settles every message on its
// own. A message that cannot be claimed (its key or event time is poison,
// or the Middleware would refuse it) is set aside before the transaction;
// one the handler names with adapter.PoisonItem, or the Middleware with an
// idempotent.BatchKeyError, is set aside after it, and the rest run again
// without it.
func (w worker) handleBatch(ctx context.Context, msgs []*pubsub.Message) {
	c := w.c
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
	w.settle(ctx, ds, res)
}

// settle acks, dead-letters or requeues each delivery as the settle rule
// decides for the Middleware's answer, then tells the Observer. The
// requeued ones are held for the longest of their delays (at most the
// retry policy's maximum, and only until the Run stops receiving), then
// nacked where the driver can.
func (w worker) settle(ctx context.Context, ds []delivery, res []adapter.Result) {
	c := w.c
	var requeue []int
	var wait time.Duration
	for i, d := range ds {
		err := res[i].Err
		// gocloud.dev/pubsub counts no deliveries: every one is a first
		// attempt for the backoff.
		dec := c.rule.Settle(d.msg, err, 1)
		switch dec.Action {
		case adapter.Ack:
			typ := adapter.EventApplied
			if res[i].Outcome == idempotent.Duplicate {
				typ = adapter.EventDuplicate
			}
			d.m.Ack()
			c.events.Observe(ctx, adapter.Event{Type: typ, Message: d.msg, Source: d.m.LoggableID, Detail: d.m})
		case adapter.DeadLetter:
			if c.dead != nil {
				if derr := c.deadLetter(ctx, d, err); derr != nil {
					c.events.Observe(ctx, adapter.Event{Type: adapter.EventSettleFailed, Message: d.msg, Source: d.m.LoggableID, Err: derr, Detail: d.m})
					res[i].Err = fmt.Errorf("%w (poison: %w)", derr, err)
					requeue = append(requeue, i)
					wait = max(wait, c.rule.Delay(1))
					continue
				}
			}
			d.m.Ack()
			c.events.Observe(ctx, adapter.Event{Type: adapter.EventDeadLettered, Message: d.msg, Source: d.m.LoggableID, Err: err, Detail: d.m})
		default:
			requeue = append(requeue, i)
			wait = max(wait, dec.Delay)
		}
	}
	if len(requeue) == 0 {
		return
	}
	held := w.holdFor(min(wait, c.hold))
	for _, i := range requeue {
		d := ds[i]
		if d.m.Nackable() {
			d.m.Nack()
		}
		c.events.Observe(ctx, adapter.Event{Type: adapter.EventRequeued, Message: d.msg, Source: d.m.LoggableID, Delay: held, Err: res[i].Err, Detail: d.m})
	}
}

// holdFor waits d, or until the Run stops receiving, and returns how long
// it waited.
func (w worker) holdFor(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return d
	case <-w.receiving.Done():
		return time.Since(start)
	}
}

// release hands m back without running the handler: it arrived while Run
// was shutting down. A driver that cannot Nack delivers it again at its
// ack deadline.
func (w worker) release(ctx context.Context, m *pubsub.Message) {
	d, _ := w.read(m)
	if m.Nackable() {
		m.Nack()
	}
	w.c.events.Observe(ctx, adapter.Event{Type: adapter.EventReleased, Message: d.msg, Source: m.LoggableID, Detail: m})
}
