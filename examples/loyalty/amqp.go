package main

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The two consumers of the AMQP brokers (the in-process one and a real
// RabbitMQ): a hand-written amqp091 consumer around the naive
// check-then-act, and rabbitmq.NewConsumer.

// naiveRabbit is the usual hand-written amqp091 consumer around the naive
// check-then-act: a prefetch of one delivery per worker, each worker
// checks then credits, and acks after the database has committed. A crash
// between the two leaves the delivery unacked, and the broker delivers it
// again.
func (s *store) naiveRabbit(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, conn brokerConn) error {
		ch, err := conn.channel()
		if err != nil {
			return err
		}
		if err := ch.Qos(sc.workers, 0, false); err != nil {
			return err
		}
		tag := "loyalty-naive-" + randomHex(4)
		deliveries, err := ch.Consume(sc.b.queueName(), tag, false, false, false, false, nil)
		if err != nil {
			return err
		}
		// Once the run ends, a worker crashes or fails, the consumer is
		// cancelled; what is still buffered stays unacked, and closing the
		// connection hands it back.
		var crashed, stopped atomic.Bool
		var once sync.Once
		stop := func() {
			once.Do(func() {
				stopped.Store(true)
				_ = ch.Cancel(tag, false)
			})
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-ctx.Done():
				stop()
			case <-done:
			}
		}()
		var wg sync.WaitGroup
		for range sc.workers {
			wg.Go(func() {
				for d := range deliveries {
					if stopped.Load() {
						continue
					}
					// A crash: committed, and the process dies before its
					// ack leaves.
					if !sc.naiveDeliver(ctx, apply, d.Body, &crashed, conn.drop) {
						stop()
						continue
					}
					if d.Ack(false) == nil {
						sc.settle(copyOfDelivery(&d))
					}
				}
			})
		}
		wg.Wait()
		close(done)
		switch {
		case crashed.Load():
			return errCrashed
		case ctx.Err() != nil:
			return nil
		}
		return amqp.ErrClosed // the connection dropped, or a delivery failed
	}, credited, nil
}

// libraryRabbit is the same consumer through rabbitmq.NewConsumer: the
// claim and the credit in one transaction, then the ack.
func (s *store) libraryRabbit(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	// The key is the order id from the body: a natural key that survives
	// a replay tool assigning new message ids.
	key := rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id"))
	h := rabbitmq.Decode(rabbitmq.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *amqp.Delivery) error {
		// The Consumer opens the transaction before the handler runs, so
		// the price lookup waits inside it here.
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, conn brokerConn) error {
		ch, err := conn.channel()
		if err != nil {
			return err
		}
		observer := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			switch e.Type {
			case adapter.EventDuplicate:
				sc.duplicates.Add(1)
				fallthrough
			case adapter.EventApplied, adapter.EventRequeued, adapter.EventDeadLettered:
				sc.deliveries.Add(1)
			}
		})
		c, err := rabbitmq.NewConsumer(mw, h, rabbitmq.WithKey(key),
			rabbitmq.WithWorkers(sc.workers), rabbitmq.WithPrefetch(sc.workers),
			rabbitmq.WithRetryDelay(50*time.Millisecond, time.Second), rabbitmq.WithObserver(observer),
			rabbitmq.WithConsumerTag("loyalty-demo"))
		if err != nil {
			return err
		}
		return c.Run(ctx, &settleChannel{Channel: ch, sc: sc, drop: conn.drop}, sc.b.queueName())
	}, credited, nil
}

// copyOfDelivery returns the copy id a delivery carries.
func copyOfDelivery(d *amqp.Delivery) int64 {
	if id, ok := d.Headers[copyHeader].(int64); ok {
		return id
	}
	return -1
}

// settleChannel is the channel the library's consumer runs on: it counts
// each message copy once the broker has its ack or its rejection, and
// every crashEvery-th ack crashes the process instead of reaching the
// broker — the effect committed, the ack lost.
type settleChannel struct {
	rabbitmq.Channel
	sc   *scenario
	drop func()
}

func (ch *settleChannel) Consume(queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args amqp.Table) (<-chan amqp.Delivery, error) {
	in, err := ch.Channel.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
	if err != nil {
		return nil, err
	}
	out := make(chan amqp.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			d.Acknowledger = settleAck{Acknowledger: d.Acknowledger, ch: ch, copy: copyOfDelivery(&d)}
			out <- d
		}
	}()
	return out, nil
}

type settleAck struct {
	amqp.Acknowledger
	ch   *settleChannel
	copy int64
}

func (a settleAck) Ack(tag uint64, multiple bool) error {
	sc := a.ch.sc
	if n := sc.acks.Add(1); sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 {
		// Committed; the process dies before its ack leaves.
		sc.crashes.Add(1)
		a.ch.drop()
	}
	err := a.Acknowledger.Ack(tag, multiple)
	if err == nil {
		sc.settle(a.copy)
	}
	return err
}

func (a settleAck) Reject(tag uint64, requeue bool) error {
	err := a.Acknowledger.Reject(tag, requeue)
	if err == nil && !requeue {
		a.ch.sc.settle(a.copy)
	}
	return err
}
