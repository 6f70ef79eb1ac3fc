package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestRabbitMQBrokertest runs the adapters' conformance suite on the local
// RabbitMQ: a queue of each scenario's own with a dead-letter exchange,
// consumed by rabbitmq.NewConsumer and, in batch mode,
// rabbitmq.NewBatchConsumer.
func TestRabbitMQBrokertest(t *testing.T) {
	brokertest.Run(t, rabbitHarness{})
}

// rabbitKeyHeader is the AMQP header the harness puts the message key in.
const rabbitKeyHeader = "Order-Key"

type rabbitHarness struct{}

// Features: a batch consumer (Batch), a killed connection's unacked
// deliveries are requeued (Kill), a queue keeps what a stopped consumer
// left (Restart), an ack can be lost after the commit (LoseAck: the delivery
// goes back to the queue), poison is rejected to the queue's dead-letter exchange
// (DeadLetter), and the harness stamps the AMQP timestamp (TransportTime).
// A requeue reports the time the delivery was held, at most the retry
// delay's maximum, not the rule's whole delay: a message dated ahead of
// the clock comes back and is held again (no RequeueDelay).
func (rabbitHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, LoseAck: true, DeadLetter: true, TransportTime: true, RoutesByOrderKey: true}
}

func (rabbitHarness) Open(t *testing.T) brokertest.Transport {
	url := amqpURL(t)
	top := declareTopology(t, url)
	return &rabbitTransport{t: t, url: url, top: top, pub: newPublisher(t, dialTest(t, url), top.queue)}
}

type rabbitTransport struct {
	t    *testing.T
	url  string
	top  topology
	mu   sync.Mutex // the publisher's channel, dead
	pub  *publisher
	dead []string // the keys read from the dead-letter queue
}

// Publish sends m to the queue with publisher confirms: the key and
// m.Headers as AMQP headers, m.TransportTime as the AMQP timestamp.
func (tr *rabbitTransport) Publish(ctx context.Context, m brokertest.Message) error {
	h := amqp.Table{rabbitKeyHeader: m.Key}
	for k, v := range m.Headers {
		h[k] = v
	}
	p := amqp.Publishing{Headers: h, Body: m.Body, Timestamp: m.TransportTime, DeliveryMode: amqp.Persistent}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	dc, err := tr.pub.ch.PublishWithDeferredConfirmWithContext(ctx, "", tr.top.queue, true, false, p)
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return errors.Join(errors.New("rabbitmq: publish not confirmed"), err)
	}
	return nil
}

// NewConsumer builds rabbitmq.NewConsumer (or NewBatchConsumer) keyed by
// the harness's header, the suite's Observer given to WithObserver.
func (tr *rabbitTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []rabbitmq.Option{rabbitmq.WithKey(rabbitmq.Header(rabbitKeyHeader)), rabbitmq.WithWorkers(cfg.Workers),
		rabbitmq.WithRetryDelay(10*time.Millisecond, 100*time.Millisecond)}
	if cfg.Observer != nil {
		opts = append(opts, rabbitmq.WithObserver(cfg.Observer))
	}
	if cfg.NoEventTime {
		opts = append(opts, rabbitmq.WithoutEventTime())
	}
	var c *rabbitmq.Consumer
	var err error
	if cfg.Batch {
		c, err = rabbitmq.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error {
			bodies := make([][]byte, len(ds))
			for i, d := range ds {
				bodies[i] = d.Body
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, rabbitmq.WithBatchSize(cfg.BatchSize))...)
	} else {
		c, err = rabbitmq.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			return cfg.Handler(ctx, tx, d.Body)
		}, opts...)
	}
	if err != nil {
		return nil, err
	}
	return &rabbitConsumer{tr: tr, c: c, lose: cfg.LoseAck}, nil
}

// rabbitConsumer is a consumer process: a connection of its own, and Run
// on a new channel each time one closes under it (as after a lost ack),
// until it is stopped or killed.
type rabbitConsumer struct {
	tr     *rabbitTransport
	c      *rabbitmq.Consumer
	lose   func(key string) bool
	mu     sync.Mutex
	p      *process
	cancel context.CancelFunc
	done   chan error
}

func (c *rabbitConsumer) Start(ctx context.Context) error {
	p, err := dialProcess(c.tr.url)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	c.mu.Lock()
	c.p, c.cancel, c.done = p, cancel, done
	c.mu.Unlock()
	go func() {
		var once sync.Once
		for {
			ch, err := p.conn.Channel()
			if err != nil {
				done <- c.ended(err)
				return
			}
			err = c.c.Run(runCtx, &rabbitChannel{Channel: ch, lose: c.lose, ready: func() { once.Do(func() { close(ready) }) }}, c.tr.top.queue)
			_ = ch.Close()
			if runCtx.Err() != nil || p.crashed.Load() || !errors.Is(err, rabbitmq.ErrChannelClosed) {
				done <- c.ended(err)
				return
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case err := <-done:
		done <- err
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ended is Run's final error: none after a kill.
func (c *rabbitConsumer) ended(err error) error {
	if c.p.crashed.Load() {
		return nil
	}
	return err
}

// Stop cancels Run, which lets in-flight deliveries finish and settle.
func (c *rabbitConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		return nil
	}
	c.cancel()
	var err error
	select {
	case err = <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.done = nil
	if !c.p.crashed.Load() {
		_ = c.p.conn.Close()
	}
	return err
}

// Kill drops the connection's socket, as a crash does: the broker requeues
// what was not acked; a handler in flight finishes, and its ack fails.
func (c *rabbitConsumer) Kill() error {
	c.mu.Lock()
	p := c.p
	c.mu.Unlock()
	p.crash()
	return nil
}

// rabbitChannel is the Channel Run consumes on: it reports when Consume
// has registered, and makes each delivery's ack, when lose says so, hand
// the delivery back instead, as a process that dies between the commit and
// the ack does.
type rabbitChannel struct {
	*amqp.Channel
	lose  func(key string) bool
	ready func()
}

func (ch *rabbitChannel) Consume(queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args amqp.Table) (<-chan amqp.Delivery, error) {
	in, err := ch.Channel.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
	if err != nil {
		return nil, err
	}
	defer ch.ready()
	if ch.lose == nil {
		return in, nil
	}
	out := make(chan amqp.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			key, _ := d.Headers[rabbitKeyHeader].(string)
			d.Acknowledger = losingAck{Acknowledger: d.Acknowledger, lose: func() bool { return ch.lose(key) }}
			out <- d
		}
	}()
	return out, nil
}

type losingAck struct {
	amqp.Acknowledger
	lose func() bool
}

// Ack, when the ack is to be lost, hands the delivery back to the queue
// instead, as the broker does when the channel of a process that died
// after its commit closes. It does not close the channel: the consumer's
// other workers may be acking on it at that moment, and RabbitMQ answers
// a frame on a closed channel by closing the whole connection.
func (a losingAck) Ack(tag uint64, multiple bool) error {
	if a.lose() {
		if err := a.Acknowledger.Nack(tag, multiple, true); err != nil {
			return err
		}
		return errors.New("the ack lost: the delivery went back to the queue after the commit")
	}
	return a.Acknowledger.Ack(tag, multiple)
}

// Unsettled counts the queue's ready messages: once the consumers'
// connections closed, RabbitMQ has put back every delivery they did not
// ack.
func (tr *rabbitTransport) Unsettled(context.Context) (int, error) {
	conn := dialTest(tr.t, tr.url)
	defer conn.Close()
	q, err := openChannel(tr.t, conn).QueueDeclarePassive(tr.top.queue, false, false, false, false, amqp.Table{"x-dead-letter-exchange": tr.top.dlx})
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// DeadLetters reads the dead-letter queue, keeping what it read: the keys
// of every dead letter so far.
func (tr *rabbitTransport) DeadLetters(context.Context) ([]string, error) {
	conn := dialTest(tr.t, tr.url)
	defer conn.Close()
	ch := openChannel(tr.t, conn)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for {
		d, ok, err := ch.Get(tr.top.dlq, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			return tr.dead, nil
		}
		key, _ := d.Headers[rabbitKeyHeader].(string)
		tr.dead = append(tr.dead, key)
	}
}
