package rabbitmq_test

import (
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeChannel is a Channel with amqp091's contract and no broker: the test
// feeds deliveries, and every ack, nack and reject is recorded in order.
type fakeChannel struct {
	mu         sync.Mutex
	prefetch   int
	tag        string
	deliveries chan amqp.Delivery
	closes     []chan *amqp.Error
	closed     bool
	delivOpen  bool
	nextTag    uint64
	consumeErr error
	events     []string // "ack 1", "nack 2 requeue", "reject 3", "cancel", plus what tests add
}

func newFakeChannel() *fakeChannel {
	return &fakeChannel{deliveries: make(chan amqp.Delivery, 1000), delivOpen: true}
}

func (f *fakeChannel) Qos(prefetchCount, _ int, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return amqp.ErrClosed
	}
	f.prefetch = prefetchCount
	return nil
}

func (f *fakeChannel) Consume(_, consumer string, autoAck, _, _, _ bool, _ amqp.Table) (<-chan amqp.Delivery, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.consumeErr != nil {
		return nil, f.consumeErr
	}
	if autoAck {
		return nil, fmt.Errorf("fake: consumer asked for autoAck")
	}
	f.tag = consumer
	return f.deliveries, nil
}

func (f *fakeChannel) Cancel(consumer string, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, "cancel")
	if f.closed {
		return amqp.ErrClosed
	}
	if consumer != f.tag {
		return fmt.Errorf("fake: cancel of unknown consumer %q", consumer)
	}
	f.closeDeliveries(false)
	return nil
}

func (f *fakeChannel) NotifyClose(c chan *amqp.Error) chan *amqp.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		close(c)
	} else {
		f.closes = append(f.closes, c)
	}
	return c
}

func (f *fakeChannel) IsClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// closeDeliveries closes the deliveries channel, dropping the buffered ones
// when drop is set (as amqp091 does when the channel closes).
func (f *fakeChannel) closeDeliveries(drop bool) {
	if !f.delivOpen {
		return
	}
	if drop {
		for len(f.deliveries) > 0 {
			<-f.deliveries
		}
	}
	close(f.deliveries)
	f.delivOpen = false
}

// closeWith closes the channel as the broker (e != nil) or the application
// (e == nil) would: listeners first get the error, then the deliveries stop.
func (f *fakeChannel) closeWith(e *amqp.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, c := range f.closes {
		if e != nil {
			c <- e
		}
		close(c)
	}
	f.closes = nil
	f.closeDeliveries(true)
}

// deliver queues a delivery with the next tag and returns the tag.
func (f *fakeChannel) deliver(d amqp.Delivery) uint64 {
	f.mu.Lock()
	f.nextTag++
	d.DeliveryTag = f.nextTag
	d.Acknowledger = f
	f.mu.Unlock()
	f.deliveries <- d
	return d.DeliveryTag
}

func (f *fakeChannel) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fmt.Sprintf(format, args...))
}

func (f *fakeChannel) settle(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return amqp.ErrClosed
	}
	f.events = append(f.events, fmt.Sprintf(format, args...))
	return nil
}

func (f *fakeChannel) Ack(tag uint64, multiple bool) error {
	if multiple {
		return fmt.Errorf("fake: multiple ack")
	}
	return f.settle("ack %d", tag)
}

func (f *fakeChannel) Nack(tag uint64, multiple, requeue bool) error {
	if multiple {
		return fmt.Errorf("fake: multiple nack")
	}
	if requeue {
		return f.settle("nack %d requeue", tag)
	}
	return f.settle("nack %d", tag)
}

func (f *fakeChannel) Reject(tag uint64, requeue bool) error {
	if requeue {
		return f.settle("reject %d requeue", tag)
	}
	return f.settle("reject %d", tag)
}

func (f *fakeChannel) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}
