package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/rabbitmq"
)

// memBroker is a small in-process broker with one queue and RabbitMQ's
// at-least-once semantics, so that the demo runs with nothing installed:
//
//   - messages are pushed round-robin to the consumers whose channel has
//     fewer unacked deliveries than its prefetch;
//   - a delivery stays unacked until its channel acks, nacks or rejects it;
//   - when a channel or its connection closes, its unacked deliveries go
//     back to the head of the queue, flagged redelivered, and the client's
//     buffered deliveries are dropped, as amqp091 drops them;
//   - nack or reject with requeue puts the message back at the head; reject
//     without requeue moves it to the dead-letter list.
//
// Its channels implement rabbitmq.Channel, and its deliveries carry the
// channel as their amqp091.Acknowledger, so the rabbitmq adapter runs on it
// unchanged.
type memBroker struct {
	mu        sync.Mutex
	ready     []memMsg // the queue; ready[0] is delivered next
	consumers []*memConsumer
	next      int // round-robin position in consumers
	unacked   int
	dead      []memMsg
}

type memMsg struct {
	pub         amqp.Publishing
	redelivered bool
}

type memConn struct {
	b        *memBroker
	channels []*memChannel
	closed   bool
}

type memChannel struct {
	b         *memBroker
	conn      *memConn
	closed    bool
	prefetch  int
	nextTag   uint64
	unacked   map[uint64]memMsg
	consumers map[string]*memConsumer
	closes    []chan *amqp.Error
}

type memConsumer struct {
	ch  *memChannel
	tag string
	out chan amqp.Delivery
}

const memQueue = "loyalty.order-completed"

func newMemBroker() *memBroker { return &memBroker{} }

// publish appends msgs to the queue.
func (b *memBroker) publish(_ context.Context, msgs []amqp.Publishing) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		b.ready = append(b.ready, memMsg{pub: m})
	}
	b.dispatch()
	return nil
}

// pending returns how many messages are ready or unacked.
func (b *memBroker) pending(context.Context) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ready) + b.unacked, nil
}

func (b *memBroker) deadLettered(context.Context) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.dead), nil
}

func (b *memBroker) connect(context.Context) (brokerConn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &memConn{b: b}, nil
}

func (b *memBroker) describe() string { return "in-process broker" }

func (b *memBroker) close() error { return nil }

// dispatch hands ready messages to consumers with room, round-robin. The
// caller holds b.mu.
func (b *memBroker) dispatch() {
	for len(b.ready) > 0 && len(b.consumers) > 0 {
		var c *memConsumer
		for i := range b.consumers {
			cand := b.consumers[(b.next+i)%len(b.consumers)]
			if len(cand.ch.unacked) < cand.ch.prefetch {
				c = cand
				b.next = (b.next + i + 1) % len(b.consumers)
				break
			}
		}
		if c == nil {
			return
		}
		m := b.ready[0]
		b.ready = b.ready[1:]
		ch := c.ch
		ch.nextTag++
		ch.unacked[ch.nextTag] = m
		b.unacked++
		p := m.pub
		// out's capacity is the prefetch, and unacked counts what is in
		// it, so this send never blocks.
		c.out <- amqp.Delivery{
			Acknowledger: ch, Headers: p.Headers, ContentType: p.ContentType, DeliveryMode: p.DeliveryMode,
			MessageId: p.MessageId, Timestamp: p.Timestamp, Type: p.Type, AppId: p.AppId,
			ConsumerTag: c.tag, DeliveryTag: ch.nextTag, Redelivered: m.redelivered,
			RoutingKey: memQueue, Body: p.Body,
		}
	}
}

func (b *memBroker) removeConsumer(c *memConsumer) {
	for i, x := range b.consumers {
		if x == c {
			b.consumers = append(b.consumers[:i], b.consumers[i+1:]...)
			if b.next > i {
				b.next--
			}
			break
		}
	}
	if len(b.consumers) > 0 {
		b.next %= len(b.consumers)
	} else {
		b.next = 0
	}
}

// requeue puts messages back at the head of the queue, flagged redelivered.
// The caller holds b.mu.
func (b *memBroker) requeue(msgs ...memMsg) {
	back := make([]memMsg, 0, len(msgs)+len(b.ready))
	for _, m := range msgs {
		m.redelivered = true
		back = append(back, m)
	}
	b.ready = append(back, b.ready...)
}

// channel opens a channel on the connection.
func (c *memConn) channel() (rabbitmq.Channel, error) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.closed {
		return nil, amqp.ErrClosed
	}
	ch := &memChannel{b: c.b, conn: c, unacked: map[uint64]memMsg{}, consumers: map[string]*memConsumer{}}
	c.channels = append(c.channels, ch)
	return ch, nil
}

// drop closes the connection abruptly, as a crashed process or a network
// failure does: every channel closes with an error and its unacked
// deliveries return to the queue.
func (c *memConn) drop() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.closeLocked(&amqp.Error{Code: amqp.FrameError, Reason: "connection reset by peer (simulated crash)"})
}

// close closes the connection cleanly.
func (c *memConn) close() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.closeLocked(nil)
}

func (c *memConn) closeLocked(e *amqp.Error) {
	if c.closed {
		return
	}
	c.closed = true
	for _, ch := range c.channels {
		ch.closeLocked(e)
	}
	c.b.dispatch()
}

// closeLocked closes the channel: its unacked deliveries go back to the
// queue in tag order, listeners hear e (nil for a clean close), then the
// deliveries channels are emptied and closed. The caller holds b.mu.
func (ch *memChannel) closeLocked(e *amqp.Error) {
	if ch.closed {
		return
	}
	ch.closed = true
	msgs := make([]memMsg, 0, len(ch.unacked))
	for tag := uint64(1); tag <= ch.nextTag; tag++ {
		if m, ok := ch.unacked[tag]; ok {
			msgs = append(msgs, m)
		}
	}
	ch.b.unacked -= len(msgs)
	ch.unacked = nil
	ch.b.requeue(msgs...)
	for _, l := range ch.closes {
		if e != nil {
			select {
			case l <- e:
			default:
			}
		}
		close(l)
	}
	ch.closes = nil
	for _, c := range ch.consumers {
		ch.b.removeConsumer(c)
		for len(c.out) > 0 {
			<-c.out
		}
		close(c.out)
	}
	ch.consumers = nil
}

// Qos sets the channel's prefetch count.
func (ch *memChannel) Qos(prefetchCount, _ int, _ bool) error {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	if ch.closed {
		return amqp.ErrClosed
	}
	if prefetchCount < 1 {
		return fmt.Errorf("in-process broker: prefetch %d: set a positive prefetch", prefetchCount)
	}
	ch.prefetch = prefetchCount
	return nil
}

// Consume registers a consumer with manual acks.
func (ch *memChannel) Consume(queue, consumer string, autoAck, _, _, _ bool, _ amqp.Table) (<-chan amqp.Delivery, error) {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	switch {
	case ch.closed:
		return nil, amqp.ErrClosed
	case queue != memQueue:
		return nil, &amqp.Error{Code: amqp.NotFound, Reason: fmt.Sprintf("NOT_FOUND - no queue '%s'", queue)}
	case autoAck:
		return nil, fmt.Errorf("in-process broker: autoAck is not supported")
	case ch.prefetch == 0:
		return nil, fmt.Errorf("in-process broker: call Qos before Consume")
	case consumer == "" || ch.consumers[consumer] != nil:
		return nil, fmt.Errorf("in-process broker: consumer tag %q is empty or in use", consumer)
	}
	c := &memConsumer{ch: ch, tag: consumer, out: make(chan amqp.Delivery, ch.prefetch)}
	ch.consumers[consumer] = c
	ch.b.consumers = append(ch.b.consumers, c)
	ch.b.dispatch()
	return c.out, nil
}

// Cancel stops deliveries to the consumer; the ones it already received stay
// readable and unacked.
func (ch *memChannel) Cancel(consumer string, _ bool) error {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	if ch.closed {
		return amqp.ErrClosed
	}
	c := ch.consumers[consumer]
	if c == nil {
		return fmt.Errorf("in-process broker: no consumer %q", consumer)
	}
	delete(ch.consumers, consumer)
	ch.b.removeConsumer(c)
	close(c.out)
	ch.b.dispatch()
	return nil
}

// NotifyClose registers a listener for the channel's close.
func (ch *memChannel) NotifyClose(l chan *amqp.Error) chan *amqp.Error {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	if ch.closed {
		close(l)
	} else {
		ch.closes = append(ch.closes, l)
	}
	return l
}

// IsClosed reports whether the channel is closed.
func (ch *memChannel) IsClosed() bool {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	return ch.closed
}

// settle removes the delivery tag from the unacked set, or closes the
// channel with PRECONDITION_FAILED for an unknown tag, as RabbitMQ does.
func (ch *memChannel) settle(tag uint64, multiple bool) (memMsg, error) {
	if ch.closed {
		return memMsg{}, amqp.ErrClosed
	}
	m, ok := ch.unacked[tag]
	if !ok || multiple {
		e := &amqp.Error{Code: amqp.PreconditionFailed, Reason: fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag)}
		ch.closeLocked(e)
		ch.b.dispatch()
		return memMsg{}, e
	}
	delete(ch.unacked, tag)
	ch.b.unacked--
	return m, nil
}

// Ack acknowledges a delivery: the broker forgets the message.
func (ch *memChannel) Ack(tag uint64, multiple bool) error {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	if _, err := ch.settle(tag, multiple); err != nil {
		return err
	}
	ch.b.dispatch()
	return nil
}

// Nack requeues the delivery, or dead-letters it.
func (ch *memChannel) Nack(tag uint64, multiple, requeue bool) error {
	ch.b.mu.Lock()
	defer ch.b.mu.Unlock()
	m, err := ch.settle(tag, multiple)
	if err != nil {
		return err
	}
	if requeue {
		ch.b.requeue(m)
	} else {
		h := amqp.Table{}
		for k, v := range m.pub.Headers {
			h[k] = v
		}
		h["x-death"] = []any{amqp.Table{"reason": "rejected", "queue": memQueue, "time": time.Now()}}
		m.pub.Headers = h
		ch.b.dead = append(ch.b.dead, m)
	}
	ch.b.dispatch()
	return nil
}

// Reject is Nack for one delivery.
func (ch *memChannel) Reject(tag uint64, requeue bool) error { return ch.Nack(tag, false, requeue) }

func (b *memBroker) queueName() string { return memQueue }
