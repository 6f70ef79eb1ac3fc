package rabbitmq

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Channel is the part of an AMQP channel a Consumer uses. *amqp091.Channel
// implements it; so can a test double or an in-process broker.
//
// The contract is amqp091's: the deliveries channel returned by Consume is
// closed after Cancel, and when the channel closes; NotifyClose's listener
// receives the broker's error (if any) and is then closed, and is closed at
// once if the channel is already closed; IsClosed reports a closed channel.
// Each delivery's Acknowledger acks, nacks and rejects on this channel.
type Channel interface {
	// Qos sets the prefetch count (basic.qos).
	Qos(prefetchCount, prefetchSize int, global bool) error
	// Consume registers a consumer (basic.consume); Run asks for manual
	// acks.
	Consume(queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args amqp.Table) (<-chan amqp.Delivery, error)
	// Cancel stops deliveries to the consumer (basic.cancel).
	Cancel(consumer string, noWait bool) error
	// NotifyClose registers a listener for the channel's closing.
	NotifyClose(c chan *amqp.Error) chan *amqp.Error
	// IsClosed reports whether the channel is closed.
	IsClosed() bool
}

var _ Channel = (*amqp.Channel)(nil)

// Consumer consumes a queue through an idempotent.Middleware and settles
// every delivery once its transaction has ended. It is safe for concurrent
// use; Run may be called again, or on several channels at once.
type Consumer struct {
	mw   *idempotent.Middleware
	h    Handler      // NewConsumer's
	bh   BatchHandler // NewBatchConsumer's
	cfg  config
	rule adapter.Rule
	hold time.Duration // the longest a delivery is held before its requeue
	obs  adapter.Counter
	dead *adapter.DeadLetters // with WithDeadLetter
}

// NewConsumer returns a Consumer that runs each delivery through mw: it
// reads the delivery's key (WithKey; the message_id property by default)
// and event time (the adapter.EventTimeHeader header by default), claims
// the key with mw.ProcessMessage and, only if the claim is new, runs h in
// the claim's transaction. The delivery is acked once the transaction has
// committed — Applied — or the claim was found — Duplicate —, and
// otherwise settled by the settle rule (see the package documentation).
//
// NewConsumer sends nothing to the broker; Run does. With WithTenant, mw
// is nil and each delivery goes to its tenant's Middleware. It returns an
// error for a nil Middleware (without WithTenant), handler or option, a bad option value, and, for a
// Middleware in partitioned mode, an event time that is not the
// producer's (WithTransportEventTime, WithoutEventTime): an error matching
// adapter.ErrNoProducerEventTime.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("rabbitmq: NewConsumer: nil handler")
	}
	c, err := newConsumer("NewConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if c.cfg.batchSize != 0 {
		return nil, errors.New("rabbitmq: NewConsumer: WithBatchSize is an option of NewBatchConsumer")
	}
	if err := c.setPrefetch("NewConsumer", 1); err != nil {
		return nil, err
	}
	c.h = h
	return c, nil
}

// NewBatchConsumer returns a Consumer that claims deliveries in batches:
// each worker takes the deliveries the broker has sent ahead, up to the
// batch size (WithBatchSize) — as many as are there, never waiting for
// more —, claims them together with mw.ProcessMessages in one transaction,
// runs h once with the fresh ones in it, and commits. Each delivery is
// then settled on its own, acked as Applied or Duplicate. A delivery whose
// key or event time is refused before any transaction (poison, or dated
// ahead of the clock) is settled alone, and the rest are claimed without
// it; so is one h sets aside with adapter.PoisonItem. Any other error of
// the batch settles each of its deliveries by the settle rule (requeued,
// after one wait, for a transient failure).
//
// Its errors are NewConsumer's; WithDeliveryContext is refused, as a batch
// has no one delivery to derive its context from.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("rabbitmq: NewBatchConsumer: nil handler")
	}
	c, err := newConsumer("NewBatchConsumer", mw, opts)
	if err != nil {
		return nil, err
	}
	if c.cfg.deliveryContext != nil {
		return nil, errors.New("rabbitmq: NewBatchConsumer: WithDeliveryContext derives one delivery's context, and a batch has many")
	}
	if c.cfg.batchSize == 0 {
		c.cfg.batchSize = DefaultBatchSize
	}
	if err := c.setPrefetch("NewBatchConsumer", c.cfg.batchSize); err != nil {
		return nil, err
	}
	c.bh = h
	return c, nil
}

// newConsumer applies opts and checks them against mw.
func newConsumer(fn string, mw *idempotent.Middleware, opts []Option) (*Consumer, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("rabbitmq: %s: nil option", fn)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, fmt.Errorf("rabbitmq: %s: %w", fn, err)
		}
	}
	if err := cfg.Check(mw); err != nil {
		return nil, err
	}
	c := &Consumer{mw: mw, cfg: cfg, rule: cfg.Rule()}
	if cfg.deadLetter != nil {
		dead, err := adapter.NewDeadLetters("rabbitmq", mw, cfg.deadLetter, DeadLetterKind)
		if err != nil {
			return nil, err
		}
		c.dead = dead
	}
	c.hold = c.rule.Backoff.MaxBackoff
	c.obs.Next = cfg.Observer()
	return c, nil
}

// setPrefetch checks the prefetch against the workers and the batch size,
// or sets the default: twice the deliveries the workers take at once.
func (c *Consumer) setPrefetch(fn string, batch int) error {
	workers := c.cfg.Workers()
	if c.cfg.prefetch == 0 {
		c.cfg.prefetch = min(2*workers*batch, MaxPrefetch)
	}
	if c.cfg.prefetch < workers {
		return fmt.Errorf("rabbitmq: %s: prefetch %d is less than the %d workers, which would sit idle", fn, c.cfg.prefetch, workers)
	}
	if c.cfg.prefetch < batch {
		return fmt.Errorf("rabbitmq: %s: prefetch %d is less than the batch size %d, which no batch could reach", fn, c.cfg.prefetch, batch)
	}
	return nil
}

// Stats returns the counts of the events the Consumer reported so far,
// over all its Runs.
func (c *Consumer) Stats() adapter.Stats { return c.obs.Stats() }

// run is one Run: its queue, and whether it is shutting down.
type run struct {
	queue    string
	stopping chan struct{}
}

func (r *run) stopped() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

func (r *run) source(d *amqp.Delivery) string {
	return fmt.Sprintf("queue %q, delivery tag %d", r.queue, d.DeliveryTag)
}

// setupError is err, a failure setting up the consumer on ch, made to match
// ErrChannelClosed too when the channel or its connection is gone — a
// connection dropped while Run set up is one the caller reconnects after,
// like one dropped mid-stream — and returned as it is otherwise (a queue
// that does not exist).
func setupError(ch Channel, err error) error {
	var ae *amqp.Error
	if ch.IsClosed() || errors.Is(err, amqp.ErrClosed) || (errors.As(err, &ae) && (ae.Code == amqp.FrameError || ae.Code == amqp.ChannelError)) {
		return fmt.Errorf("%w while setting up: %w", ErrChannelClosed, err)
	}
	return err
}

// Run consumes queue on ch until ctx ends or the channel closes. It sets
// the channel's prefetch, registers a consumer with manual acks, and runs
// the configured number of workers, each settling its delivery (or batch)
// before taking the next (see the package documentation for how).
//
// When ctx ends, Run shuts down gracefully: it cancels the consumer, lets
// in-flight deliveries finish — with a context that is not cancelled, for
// up to the shutdown timeout — and settles them, hands deliveries that
// were prefetched but not started back to the broker (nack with requeue,
// adapter.EventReleased), and returns nil once every delivery it received
// has been settled. It does not close ch.
//
// If the channel or its connection closes first, Run waits for in-flight
// handlers to return (their acks fail; the broker redelivers those
// messages) and returns an error matching ErrChannelClosed. If the broker
// cancels the consumer, the error matches ErrConsumerCancelled. Errors
// setting up the consumer (a queue that does not exist, for one) are
// returned as the broker reported them; one that comes of the channel or
// its connection closing while Run sets up matches ErrChannelClosed too. A
// panic in the handler is not recovered.
//
// Use ch for this consumer alone, with amqp091's automatic recovery off:
// after an error, open a new channel and call Run again.
func (c *Consumer) Run(ctx context.Context, ch Channel, queue string) error {
	if ch == nil {
		return errors.New("rabbitmq: Run: nil channel")
	}
	if queue == "" || len(queue) > 255 {
		return fmt.Errorf("rabbitmq: Run: queue name %q, want 1 to 255 bytes", queue)
	}
	if ctx.Err() != nil {
		return nil
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.prefetch, 0, false); err != nil {
		return setupError(ch, fmt.Errorf("rabbitmq: queue %q: set prefetch %d: %w", queue, c.cfg.prefetch, err))
	}
	tag, err := c.newTag()
	if err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return setupError(ch, fmt.Errorf("rabbitmq: consume queue %q: %w", queue, err))
	}

	// Handlers run with a context that outlives ctx, so that a shutdown
	// lets in-flight transactions commit; it ends after the shutdown
	// timeout, or when Run returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	r := &run{queue: queue, stopping: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(c.cfg.Workers())
	// With ordering, each worker takes the deliveries of its own ordering
	// keys (adapter.Route), so that one entity's deliveries run one after
	// another and need not park.
	var routed []<-chan amqp.Delivery
	if c.bh == nil && c.cfg.Routed() {
		routed = adapter.Route(deliveries, c.cfg.Workers(), 1, func(d amqp.Delivery) string { return c.cfg.RouteKey(&d) })
	}
	for w := range c.cfg.Workers() {
		go func() {
			defer wg.Done()
			if c.bh != nil {
				c.batches(hctx, r, deliveries)
				return
			}
			in := deliveries
			if routed != nil {
				in = routed[w]
			}
			for d := range in {
				c.work(hctx, r, &d)
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(workersDone)
	}()

	select {
	case <-ctx.Done():
		close(r.stopping)
		timer := time.AfterFunc(c.cfg.ShutdownTimeout(), hcancel)
		defer timer.Stop()
		// Cancel stops new deliveries; amqp091 then closes deliveries once
		// the ones already received are drained (and released by workers).
		// If the channel closed meanwhile, deliveries closes anyway.
		_ = ch.Cancel(tag, false)
		<-workersDone
		select {
		case e, ok := <-closed:
			if ok && e != nil {
				return closedError(queue, e)
			}
		default:
		}
		return nil
	case e := <-closed:
		close(r.stopping)
		<-workersDone
		return closedError(queue, e)
	case <-workersDone:
		close(r.stopping)
		// amqp091 reports a broker's close before it closes the
		// deliveries; an application's close marks the channel closed
		// before.
		select {
		case e := <-closed:
			return closedError(queue, e)
		default:
		}
		if ch.IsClosed() {
			return closedError(queue, nil)
		}
		return fmt.Errorf("%w: queue %q, consumer %q (was the queue deleted?)", ErrConsumerCancelled, queue, tag)
	}
}

func closedError(queue string, e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("%w while consuming queue %q: closed by the application", ErrChannelClosed, queue)
	}
	return fmt.Errorf("%w while consuming queue %q: %w", ErrChannelClosed, queue, e)
}

func (c *Consumer) newTag() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("rabbitmq: consumer tag: %w", err)
	}
	return c.cfg.tagPrefix + "-" + hex.EncodeToString(b), nil
}

// result is what became of one delivery, to be settled: its message as
// far as it could be read, and the Middleware's outcome or the error.
type result struct {
	d   *amqp.Delivery
	msg idempotent.Message
	out idempotent.Outcome
	err error
}

// work runs one delivery through the Middleware and settles it.
func (c *Consumer) work(ctx context.Context, r *run, d *amqp.Delivery) {
	if r.stopped() {
		c.release(ctx, r, d)
		return
	}
	if c.cfg.deliveryContext != nil {
		if dctx := c.cfg.deliveryContext(ctx, d); dctx != nil {
			ctx = dctx
		}
	}
	msg, err := c.cfg.Message(d)
	tctx, end := c.cfg.StartTrace(ctx, d, msg)
	var out idempotent.Outcome
	if err == nil {
		out, err = c.cfg.Process(tctx, c.mw, d, msg, func(ctx context.Context, tx *sql.Tx) error { return c.h(ctx, tx, d) })
	}
	end(out, err)
	c.settle(ctx, r, []result{{d: d, msg: msg, out: out, err: err}})
}

// release hands a delivery that arrived during the shutdown back to the
// broker, unprocessed.
func (c *Consumer) release(ctx context.Context, r *run, d *amqp.Delivery) {
	msg, _ := c.cfg.Message(d) // the key, for the event, if it can be read
	c.report(ctx, r, result{d: d, msg: msg}, adapter.EventReleased, 0, 0, "nack", d.Nack(false, true))
}

// settle settles results by the one settle rule: acks and rejects at once,
// then, after one wait of the longest delay among them (at most the
// retry delay's maximum, cut short by a shutdown), the requeues.
func (c *Consumer) settle(ctx context.Context, r *run, rs []result) {
	var requeue []result
	var wait time.Duration
	for _, x := range rs {
		n := attempt(x.d)
		dec := c.rule.Settle(x.msg, x.err, n)
		if dec.Action == adapter.DeadLetter && c.dead != nil {
			if err := c.deadLetter(ctx, r.queue, x); err != nil {
				// The dead letter did not commit: deliver it again later.
				dec, x.err = adapter.Decision{Action: adapter.Requeue, Delay: c.rule.Delay(n), Err: err}, err
			}
		}
		switch dec.Action {
		case adapter.Ack:
			typ := adapter.EventApplied
			if x.out == idempotent.Duplicate {
				typ = adapter.EventDuplicate
			}
			c.report(ctx, r, x, typ, n, 0, "ack", x.d.Ack(false))
		case adapter.DeadLetter:
			if c.dead != nil {
				c.report(ctx, r, x, adapter.EventDeadLettered, n, 0, "ack", x.d.Ack(false))
				continue
			}
			c.report(ctx, r, x, adapter.EventDeadLettered, n, 0, "reject", x.d.Reject(false))
		default:
			requeue = append(requeue, x)
			wait = max(wait, dec.Delay)
		}
	}
	if len(requeue) == 0 {
		return
	}
	held := r.hold(min(wait, c.hold))
	for _, x := range requeue {
		c.report(ctx, r, x, adapter.EventRequeued, attempt(x.d), held, "nack", x.d.Nack(false, true))
	}
}

// hold waits d, or until the Run shuts down, and returns how long it
// waited.
func (r *run) hold(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return d
	case <-r.stopping:
		return time.Since(start)
	}
}

// report tells the observer how x was settled, and that the ack, nack or
// reject (verb) failed, when settleErr says so.
func (c *Consumer) report(ctx context.Context, r *run, x result, typ adapter.EventType, attempt int, delay time.Duration, verb string, settleErr error) {
	e := adapter.Event{Type: typ, Message: x.msg, Source: r.source(x.d), Attempt: attempt, Delay: delay, Detail: x.d}
	if typ != adapter.EventApplied && typ != adapter.EventDuplicate {
		e.Err = x.err
	}
	c.obs.Observe(ctx, e)
	if settleErr != nil {
		c.obs.Observe(ctx, adapter.Event{Type: adapter.EventSettleFailed, Message: x.msg, Source: e.Source, Attempt: attempt,
			Err: fmt.Errorf("rabbitmq: %s of %s: %w", verb, e.Source, settleErr), Detail: x.d})
	}
}

// attempt counts d's deliveries from 1, for the retry delay: a quorum
// queue's x-delivery-count header plus one, else 1.
func attempt(d *amqp.Delivery) int {
	var n int64
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		n = v
	case int32:
		n = int64(v)
	case int16:
		n = int64(v)
	case int8:
		n = int64(v)
	case int:
		n = int64(v)
	case uint8:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint32:
		n = int64(v)
	default:
		return 1
	}
	return int(min(max(n, 0), 1<<20)) + 1
}
