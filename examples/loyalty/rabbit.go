package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/rabbitmq"
)

// rabbitBroker runs the scenario on a real RabbitMQ: a queue of its own with
// a dead-letter exchange and queue, all deleted by close.
type rabbitBroker struct {
	url   string
	desc  string
	admin *amqp.Connection
	pub   *amqp.Channel
	queue string
	dlx   string
	dlq   string
}

// dialRabbit connects and declares the run's queues.
func dialRabbit(rawURL string) (*rabbitBroker, error) {
	desc, err := parseAMQP(rawURL)
	if err != nil {
		return nil, err
	}
	b := &rabbitBroker{url: rawURL, desc: desc}
	if b.admin, err = amqp.DialConfig(rawURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err != nil {
		return nil, fmt.Errorf("broker %s does not answer: %w", b.desc, err)
	}
	fail := func(err error) (*rabbitBroker, error) {
		_ = b.close()
		return nil, fmt.Errorf("broker %s: %w", b.desc, err)
	}
	if b.pub, err = b.admin.Channel(); err != nil {
		return fail(err)
	}
	if err := b.pub.Confirm(false); err != nil {
		return fail(err)
	}
	id := randomHex(4)
	b.queue, b.dlx, b.dlq = "loyalty-demo-"+id, "loyalty-demo-"+id+"-dlx", "loyalty-demo-"+id+"-dead"
	if err := b.pub.ExchangeDeclare(b.dlx, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		return fail(err)
	}
	if _, err := b.pub.QueueDeclare(b.dlq, false, false, false, false, nil); err != nil {
		return fail(err)
	}
	if err := b.pub.QueueBind(b.dlq, "", b.dlx, false, nil); err != nil {
		return fail(err)
	}
	if _, err := b.pub.QueueDeclare(b.queue, false, false, false, false, amqp.Table{"x-dead-letter-exchange": b.dlx}); err != nil {
		return fail(err)
	}
	return b, nil
}

func (b *rabbitBroker) describe() string { return b.desc }

func (b *rabbitBroker) queueName() string { return b.queue }

// publish publishes msgs with confirms and waits for them.
func (b *rabbitBroker) publish(ctx context.Context, msgs []amqp.Publishing) error {
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := b.pub.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, true, false, m)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish: not confirmed by the broker (%v)", err)
		}
	}
	return nil
}

// pending returns the messages ready in the queue (RabbitMQ does not count
// unacked ones here; the scenario also tracks settlements).
func (b *rabbitBroker) pending(context.Context) (int, error) {
	return b.depth(b.queue)
}

func (b *rabbitBroker) deadLettered(context.Context) (int, error) { return b.depth(b.dlq) }

func (b *rabbitBroker) depth(queue string) (int, error) {
	ch, err := b.admin.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	return q.Messages, err
}

func (b *rabbitBroker) connect(context.Context) (brokerConn, error) {
	c := &rabbitConn{}
	conn, err := amqp.DialConfig(b.url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		nc, err := amqp.DefaultDial(5*time.Second)(network, addr)
		c.mu.Lock()
		c.netConn = nc
		c.mu.Unlock()
		return nc, err
	}})
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return c, nil
}

func (b *rabbitBroker) close() error {
	if b.pub != nil && !b.pub.IsClosed() {
		for _, q := range []string{b.queue, b.dlq} {
			if q != "" {
				_, _ = b.pub.QueueDelete(q, false, false, false)
			}
		}
		if b.dlx != "" {
			_ = b.pub.ExchangeDelete(b.dlx, false, false)
		}
	}
	if b.admin == nil {
		return nil
	}
	return b.admin.Close()
}

// rabbitConn is one consumer process's connection.
type rabbitConn struct {
	conn    *amqp.Connection
	mu      sync.Mutex
	netConn net.Conn
}

func (c *rabbitConn) channel() (rabbitmq.Channel, error) { return c.conn.Channel() }

// drop closes the socket under the client, with no AMQP close handshake:
// to the broker, the process crashed or the network failed.
func (c *rabbitConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.netConn.Close()
}

func (c *rabbitConn) close() { _ = c.conn.Close() }
