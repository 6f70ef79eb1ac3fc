package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// Action is how a Consumer settled a delivery.
type Action int

const (
	// Acked: the handler succeeded (the effect committed, or was found
	// applied before), and the delivery was acked.
	Acked Action = iota + 1
	// Requeued: the settle rule said requeue (the handler failed with an
	// error that is not poison, or the message is dated ahead of the
	// clock); after the rule's delay, at most the requeue delay, the
	// delivery was nacked with requeue.
	Requeued
	// DeadLettered: the settle rule, ErrPoison or a WithPoison predicate
	// said poison; the delivery was rejected without requeue, for the
	// queue's dead-letter exchange.
	DeadLettered
	// Released: the delivery arrived while Run was shutting down and was
	// nacked with requeue without running the handler.
	Released
)

// String returns the action's name: "acked", "requeued", "dead-lettered"
// or "released".
func (a Action) String() string {
	switch a {
	case Acked:
		return "acked"
	case Requeued:
		return "requeued"
	case DeadLettered:
		return "dead-lettered"
	case Released:
		return "released"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Settlement describes how one delivery was settled; see WithOnSettle.
type Settlement struct {
	// Delivery is the delivery.
	Delivery *amqp.Delivery
	// Action is what the Consumer told the broker.
	Action Action
	// Outcome is the handler's outcome when Action is Acked.
	Outcome idempotent.Outcome
	// Err is the handler's error when Action is Requeued or DeadLettered.
	Err error
	// SettleErr is the error from sending the ack, nack or reject, usually
	// because the channel closed: the broker will redeliver the message
	// (and, if the effect committed, the claim will make it a duplicate).
	SettleErr error
}

// Stats counts what a Consumer did, over all its Runs.
type Stats struct {
	// Delivered is how many deliveries were handed to the handler.
	Delivered int64
	// Applied and Duplicates count the handler's successful outcomes.
	Applied, Duplicates int64
	// Acked, Requeued, DeadLettered and Released count deliveries the
	// broker was told about successfully, by action.
	Acked, Requeued, DeadLettered, Released int64
	// SettleFailed counts acks, nacks and rejects that could not be sent.
	SettleFailed int64
}

type counters struct {
	delivered, applied, duplicates                        atomic.Int64
	acked, requeued, deadLettered, released, settleFailed atomic.Int64
}

// Consumer consumes one queue and settles every delivery after its handler
// returns. It is safe for concurrent use; Run may be called again, or on
// several channels at once.
type Consumer struct {
	queue  string
	handle Handler
	cfg    config
	stats  counters
}

// NewConsumer returns a Consumer of queue that passes each delivery to h
// (usually built with Process or Decode). It sends nothing to the broker;
// Run does.
func NewConsumer(queue string, h Handler, opts ...Option) (*Consumer, error) {
	if queue == "" || len(queue) > 255 {
		return nil, fmt.Errorf("rabbitmq: NewConsumer: queue name %q, want 1 to 255 bytes", queue)
	}
	if h == nil {
		return nil, errors.New("rabbitmq: NewConsumer: nil handler")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("rabbitmq: NewConsumer: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.prefetch == 0 {
		cfg.prefetch = min(2*cfg.workers, 65535)
	}
	if cfg.prefetch < cfg.workers {
		return nil, fmt.Errorf("rabbitmq: NewConsumer: prefetch %d is less than the %d workers, which would sit idle", cfg.prefetch, cfg.workers)
	}
	return &Consumer{queue: queue, handle: h, cfg: cfg}, nil
}

// Stats returns the counts so far.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Acked: s.acked.Load(), Requeued: s.requeued.Load(), DeadLettered: s.deadLettered.Load(),
		Released: s.released.Load(), SettleFailed: s.settleFailed.Load(),
	}
}

// setupError is err, a failure setting up the consumer on ch, made to match
// ErrChannelClosed too when the channel or its connection is gone — a
// connection dropped while Run set up is one the caller reconnects after,
// like one dropped mid-stream — and returned as it is otherwise (a queue
// that does not exist).
func (c *Consumer) setupError(ch Channel, err error) error {
	var ae *amqp.Error
	if ch.IsClosed() || errors.Is(err, amqp.ErrClosed) || (errors.As(err, &ae) && (ae.Code == amqp.FrameError || ae.Code == amqp.ChannelError)) {
		return fmt.Errorf("%w while setting up: %w", ErrChannelClosed, err)
	}
	return err
}

// Run consumes the queue on ch until ctx ends or the channel closes. It sets
// the channel's prefetch, registers a consumer with manual acks, and runs the
// configured number of workers, each settling a delivery before taking the
// next (see the package documentation for how).
//
// When ctx ends, Run shuts down gracefully: it cancels the consumer, lets
// in-flight deliveries finish — with a context that is not cancelled, for up
// to the shutdown timeout — and acks them, hands deliveries that were
// prefetched but not started back to the broker (nack with requeue), and
// returns nil once every delivery it received has been settled. It does not
// close ch.
//
// If the channel or its connection closes first, Run waits for in-flight
// handlers to return (their acks fail; the broker redelivers those messages)
// and returns an error matching ErrChannelClosed. If the broker cancels the
// consumer, the error matches ErrConsumerCancelled. Errors setting up the
// consumer (a queue that does not exist, for one) are returned as the
// broker reported them; one that comes of the channel or its connection
// closing while Run sets up matches ErrChannelClosed too. A panic in the
// handler is not recovered.
//
// Use ch for this consumer alone, with amqp091's automatic recovery off:
// after an error, open a new channel and call Run again.
func (c *Consumer) Run(ctx context.Context, ch Channel) error {
	if ch == nil {
		return errors.New("rabbitmq: Run: nil channel")
	}
	if ctx.Err() != nil {
		return nil
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.prefetch, 0, false); err != nil {
		return c.setupError(ch, fmt.Errorf("rabbitmq: queue %q: set prefetch %d: %w", c.queue, c.cfg.prefetch, err))
	}
	tag, err := c.newTag()
	if err != nil {
		return err
	}
	deliveries, err := ch.Consume(c.queue, tag, false, false, false, false, nil)
	if err != nil {
		return c.setupError(ch, fmt.Errorf("rabbitmq: consume queue %q: %w", c.queue, err))
	}

	// Handlers run with a context that outlives ctx, so that a shutdown
	// lets in-flight transactions commit; it ends after the shutdown
	// timeout, or when Run returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stopping := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(c.cfg.workers)
	for range c.cfg.workers {
		go func() {
			defer wg.Done()
			for d := range deliveries {
				c.work(hctx, &d, stopping)
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
		close(stopping)
		timer := time.AfterFunc(c.cfg.shutdownTimeout, hcancel)
		defer timer.Stop()
		// Cancel stops new deliveries; amqp091 then closes deliveries once
		// the ones already received are drained (and released by workers).
		// If the channel closed meanwhile, deliveries closes anyway.
		_ = ch.Cancel(tag, false)
		<-workersDone
		select {
		case e, ok := <-closed:
			if ok && e != nil {
				return c.closedError(e)
			}
		default:
		}
		return nil
	case e := <-closed:
		close(stopping)
		<-workersDone
		return c.closedError(e)
	case <-workersDone:
		close(stopping)
		// amqp091 reports a broker's close before it closes the
		// deliveries; an application's close marks the channel closed
		// before.
		select {
		case e := <-closed:
			return c.closedError(e)
		default:
		}
		if ch.IsClosed() {
			return c.closedError(nil)
		}
		return fmt.Errorf("%w: queue %q, consumer %q (was the queue deleted?)", ErrConsumerCancelled, c.queue, tag)
	}
}

func (c *Consumer) closedError(e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("%w while consuming queue %q: closed by the application", ErrChannelClosed, c.queue)
	}
	return fmt.Errorf("%w while consuming queue %q: %w", ErrChannelClosed, c.queue, e)
}

func (c *Consumer) newTag() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("rabbitmq: consumer tag: %w", err)
	}
	return c.cfg.tagPrefix + "-" + hex.EncodeToString(b), nil
}

// work runs the handler for one delivery and settles it.
func (c *Consumer) work(ctx context.Context, d *amqp.Delivery, stopping <-chan struct{}) {
	select {
	case <-stopping:
		c.settle(ctx, Settlement{Delivery: d, Action: Released}, d.Nack(false, true))
		return
	default:
	}
	if c.cfg.deliveryContext != nil {
		if dctx := c.cfg.deliveryContext(ctx, d); dctx != nil {
			ctx = dctx
		}
	}
	c.stats.delivered.Add(1)
	outcome, err := c.handle(ctx, d)
	dec := c.decide(d, err)
	switch dec.Action {
	case adapter.Ack:
		switch outcome {
		case idempotent.Applied:
			c.stats.applied.Add(1)
		case idempotent.Duplicate:
			c.stats.duplicates.Add(1)
		}
		c.settle(ctx, Settlement{Delivery: d, Action: Acked, Outcome: outcome}, d.Ack(false))
	case adapter.DeadLetter:
		c.settle(ctx, Settlement{Delivery: d, Action: DeadLettered, Err: err}, d.Reject(false))
	default:
		// The worker holds the delivery for the rule's delay, at most the
		// requeue delay: a longer wait (a message dated ahead of the clock)
		// is served by requeueing it again when it comes back.
		if hold := min(dec.Delay, c.cfg.requeueDelay); hold > 0 {
			t := time.NewTimer(hold)
			select {
			case <-t.C:
			case <-stopping:
				t.Stop()
			}
		}
		c.settle(ctx, Settlement{Delivery: d, Action: Requeued, Err: err}, d.Nack(false, true))
	}
}

// decide is how every delivery is settled: an error marked poison
// (ErrPoison, a WithPoison predicate) is poison, everything else goes
// through the one settle rule, with the message and Middleware clock a
// Process or Decode Handler's error carries.
func (c *Consumer) decide(d *amqp.Delivery, err error) adapter.Decision {
	if err != nil && c.markedPoison(err) {
		return adapter.Decision{Action: adapter.DeadLetter, Err: err}
	}
	rule, msg := settleRule(err, c.cfg.backoff())
	return rule.Settle(msg, err, attempt(d))
}

// settleRule returns the rule for a Handler's error and the message it
// carries: the Middleware's clock and clock-skew margin for an error of a
// Process or Decode Handler, the defaults otherwise.
func settleRule(err error, backoff idempotent.RetryPolicy) (adapter.Rule, idempotent.Message) {
	var he *handlerError
	if errors.As(err, &he) {
		return adapter.RuleFor(he.mw, backoff), he.msg
	}
	return adapter.Rule{Backoff: backoff}, idempotent.Message{}
}

// attempt counts d's deliveries from 1, for the backoff: a quorum queue's
// x-delivery-count header plus one, else 2 for a redelivery and 1 for a
// first delivery.
func attempt(d *amqp.Delivery) int {
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		return int(min(n, 1<<20)) + 1
	case int32:
		return int(n) + 1
	case int:
		return min(n, 1<<20) + 1
	}
	if d.Redelivered {
		return 2
	}
	return 1
}

func (c *Consumer) markedPoison(err error) bool {
	if errors.Is(err, ErrPoison) {
		return true
	}
	for _, p := range c.cfg.poison {
		if p(err) {
			return true
		}
	}
	return false
}

func (c *Consumer) settle(ctx context.Context, s Settlement, settleErr error) {
	s.SettleErr = settleErr
	if settleErr != nil {
		c.stats.settleFailed.Add(1)
	} else {
		switch s.Action {
		case Acked:
			c.stats.acked.Add(1)
		case Requeued:
			c.stats.requeued.Add(1)
		case DeadLettered:
			c.stats.deadLettered.Add(1)
		case Released:
			c.stats.released.Add(1)
		}
	}
	if c.cfg.onSettle != nil {
		c.cfg.onSettle(ctx, s)
	}
}
