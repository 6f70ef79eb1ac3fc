//go:build loyalty_pubsub || loyalty_sqs

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gocloud.dev/gcerrors"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/batcher"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The Go CDK part: -broker pubsub, on the in-process mempubsub.
func init() {
	brokers["pubsub"] = brokerMode{start: func(context.Context, options) (brokerSetup, error) {
		return brokerSetup{
			desc:      pubsubDesc,
			newBroker: func() (broker, error) { return newPubsubTopic(), nil },
			naive:     (*store).naivePubsub, library: (*store).libraryPubsub,
			restart: 20 * time.Millisecond,
		}, nil
	}}
}

// pubsubAckDeadline is the subscription's ack deadline: how long a message
// received by a process that crashed, or whose ack was lost, waits before
// mempubsub delivers it again.
const pubsubAckDeadline = 2 * time.Second

// oneAtATime makes a Subscription take one message at a time from its
// driver: each worker holds one message, as with the other brokers'
// prefetch of one, rather than a second's worth waiting in a queue while
// their ack deadline runs.
var oneAtATime = batcher.Options{MaxBatchSize: 1, MaxHandlers: 1}

// newPubsubTopic creates a run's topic with one subscription on it, the
// loyalty service's: every consumer process receives from it, as the
// processes of a service share their Pub/Sub subscription or SQS queue.
func newPubsubTopic() *pubsubTopic {
	topic := mempubsub.NewTopic()
	t := newServiceTopic(pubsubDesc, topic, mempubsub.NewSubscriptionWithOptions(topic, pubsubAckDeadline,
		&mempubsub.SubscriptionOptions{ReceiveBatcherOptions: oneAtATime}))
	t.ackLost = true
	return t
}

// newServiceTopic is a run's topic on a service's topic and the loyalty
// service's subscription of it (sqs.go's is an SQS queue).
func newServiceTopic(desc string, topic *pubsub.Topic, sub *pubsub.Subscription) *pubsubTopic {
	return &pubsubTopic{desc: desc, topic: topic, sub: sub, acked: map[int64]bool{}, received: map[int64]bool{},
		took: make(chan struct{}, 1), done: make(chan struct{})}
}

// pubsubTopic is one run's topic and subscription; it implements broker.
type pubsubTopic struct {
	desc    string
	topic   *pubsub.Topic
	sub     *pubsub.Subscription
	ackLost bool   // close acks the lost deliveries (mempubsub), else nacks them (SQS: their receipt handles are stale by then, which a nack, unlike a delete, ignores)
	cleanup func() // nil, or what close does last (sqs.go: delete the queue)

	sending sync.WaitGroup
	done    chan struct{} // closed by close: publishing stops

	mu        sync.Mutex
	total     int               // handed to publish
	published int               // sent
	sendErr   error             // publishing's failure, reported by pending
	received  map[int64]bool    // the copies delivered at least once
	acked     map[int64]bool    // the copies whose ack reached the subscription
	lost      []*pubsub.Message // deliveries whose ack was lost, let go of by close
	took      chan struct{}     // signalled when a copy is first delivered
}

// pubsubBacklog is how many messages publish lets wait in the subscription
// before it sends more.
const pubsubBacklog = 8

func (t *pubsubTopic) describe() string  { return t.desc }
func (t *pubsubTopic) queueName() string { return "loyalty" }

// publish sends msgs with the message id in the idempotency-key metadata
// key and the producer's event time in Idempotent-Event-Time, the keys the
// cdkpubsub package reads. An order published twice is a producer's retry
// after a lost reply: the service keeps both. The service delivers in no
// particular order (mempubsub picks at random among what is waiting, as
// Pub/Sub without ordering keys delivers in no order), so publish sends at
// the consumers' pace, as live traffic comes, never more than
// pubsubBacklog messages ahead of them: the two copies of an order then
// wait together, and two workers take them at the same moment.
//
// publish returns at once, and sends in the background while the
// consumers run; pending counts what it has not sent yet.
func (t *pubsubTopic) publish(ctx context.Context, msgs []amqp.Publishing) error {
	t.mu.Lock()
	t.total += len(msgs)
	t.mu.Unlock()
	t.sending.Go(func() {
		if err := t.send(ctx, msgs); err != nil {
			t.mu.Lock()
			t.sendErr = err
			t.mu.Unlock()
		}
	})
	return nil
}

func (t *pubsubTopic) send(ctx context.Context, msgs []amqp.Publishing) error {
	for i, m := range msgs {
		if err := t.waitBacklog(ctx); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		id, _ := m.Headers[copyHeader].(int64)
		md := map[string]string{
			cdkpubsub.DefaultKeyMetadata: m.MessageId,
			adapter.EventTimeHeader:      adapter.FormatEventTime(m.Timestamp),
			copyHeader:                   strconv.FormatInt(id, 10),
		}
		for k, v := range m.Headers {
			if s, ok := v.(string); ok {
				md[k] = s
			}
		}
		if err := t.topic.Send(ctx, &pubsub.Message{Body: m.Body, Metadata: md}); err != nil {
			return fmt.Errorf("publish message %d: %w", i, err)
		}
		t.mu.Lock()
		t.published++
		t.mu.Unlock()
	}
	return nil
}

// waitBacklog waits until fewer than pubsubBacklog messages wait in the
// subscription, never delivered.
func (t *pubsubTopic) waitBacklog(ctx context.Context) error {
	for {
		t.mu.Lock()
		waiting := t.published - len(t.received)
		t.mu.Unlock()
		if waiting < pubsubBacklog {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.done:
			return errors.New("topic closed")
		case <-t.took:
		case <-time.After(100 * time.Millisecond): // a copy taken by a process that then crashed
		}
	}
}

// delivered counts the first delivery of m's copy.
func (t *pubsubTopic) delivered(m *pubsub.Message) {
	id := copyOfMetadata(m.Metadata)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.received[id] {
		t.received[id] = true
		select {
		case t.took <- struct{}{}:
		default:
		}
	}
}

// ack passes a process's ack of m on to the subscription.
func (t *pubsubTopic) ack(m *pubsub.Message) int64 {
	m.Ack()
	id := copyOfMetadata(m.Metadata)
	t.mu.Lock()
	t.acked[id] = true
	t.mu.Unlock()
	return id
}

// pending is what the subscription has not had acked, and what publish
// has not sent yet: mempubsub counts nothing, so the topic counts the acks
// its processes passed on.
func (t *pubsubTopic) pending(context.Context) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total - len(t.acked), t.sendErr
}

// deadLettered is 0: the loyalty events are never poison.
func (t *pubsubTopic) deadLettered(context.Context) (int, error) { return 0, nil }

// connect opens a consumer process's client on the subscription.
func (t *pubsubTopic) connect(context.Context) (brokerConn, error) {
	c := &pubsubConn{t: t, held: map[int]*pubsub.Message{}}
	c.sub = pubsub.NewSubscription(c, &oneAtATime, nil)
	return c, nil
}

// lose records deliveries whose ack was lost with a crash or a dropped
// connection: the subscription delivers them again after their ack
// deadline.
func (t *pubsubTopic) lose(ms []*pubsub.Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lost = append(t.lost, ms...)
}

// close shuts the topic down. The lost deliveries were all delivered
// again and acked by then; settling them once more does nothing but keep
// the Go CDK from logging them as never acked.
func (t *pubsubTopic) close() error {
	close(t.done)
	t.sending.Wait()
	t.mu.Lock()
	for _, m := range t.lost {
		if t.ackLost {
			m.Ack()
		} else {
			m.Nack()
		}
	}
	t.lost = nil
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := errors.Join(t.sub.Shutdown(ctx), t.topic.Shutdown(ctx))
	if t.cleanup != nil {
		t.cleanup()
	}
	return err
}

// errPubsubCrashed is what a crashed process's client returns.
var errPubsubCrashed = errors.New("the consumer process crashed")

// pubsubConn is one consumer process's client: a *pubsub.Subscription of
// its own on the service's subscription, which it reaches through the
// driver below, standing for the process's connection. What the process
// received and has not acked when it crashes, or when its connection
// drops, is the service's again once its ack deadline has passed.
type pubsubConn struct {
	t   *pubsubTopic
	sub *pubsub.Subscription

	mu        sync.Mutex
	held      map[int]*pubsub.Message // received on the connection, not yet acked
	next      int
	killed    bool
	settled   func(id int64)
	beforeAck func() (crash bool)
}

// watch sets the client's callbacks for a run.
func (c *pubsubConn) watch(sc *scenario, beforeAck func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settled, c.beforeAck = sc.settle, beforeAck
}

// drop loses the connection: the acks of what it received are lost with
// it, and those messages come again at their ack deadline. The client
// carries on, on a new connection.
func (c *pubsubConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loseHeld()
}

// crash kills the process: nothing more leaves it.
func (c *pubsubConn) crash() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killed = true
	c.loseHeld()
}

// loseHeld loses the acks of what the connection holds. c.mu must be held.
func (c *pubsubConn) loseHeld() {
	lost := make([]*pubsub.Message, 0, len(c.held))
	for _, m := range c.held {
		lost = append(lost, m)
	}
	clear(c.held)
	c.t.lose(lost)
}

func (c *pubsubConn) dead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killed
}

func (c *pubsubConn) channel() (rabbitmq.Channel, error) {
	return nil, errors.New("a pub/sub subscription has no AMQP channel")
}

func (c *pubsubConn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.sub.Shutdown(ctx)
}

// ReceiveBatch takes up to maxMessages from the service's subscription.
func (c *pubsubConn) ReceiveBatch(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	var out []*driver.Message
	wait := 50 * time.Millisecond
	for len(out) < maxMessages {
		if c.dead() {
			return out, errPubsubCrashed
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		m, err := c.t.sub.Receive(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if rctx.Err() != nil {
				return out, nil // nothing more for now
			}
			return out, err
		}
		c.t.delivered(m)
		c.mu.Lock()
		id := c.next
		c.next++
		c.held[id] = m
		c.mu.Unlock()
		out = append(out, &driver.Message{LoggableID: m.LoggableID, Body: m.Body, Metadata: maps.Clone(m.Metadata),
			AckID: id, AsFunc: func(any) bool { return false }})
		wait = time.Millisecond
	}
	return out, nil
}

// SendAcks passes the acks on, unless the process crashes first: every
// ack asks beforeAck.
func (c *pubsubConn) SendAcks(_ context.Context, ids []driver.AckID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		m := c.held[id.(int)]
		delete(c.held, id.(int))
		if m == nil {
			continue
		}
		if c.killed {
			c.t.lose([]*pubsub.Message{m})
			continue
		}
		if c.beforeAck != nil && c.beforeAck() {
			c.killed = true
			c.t.lose([]*pubsub.Message{m})
			c.loseHeld()
			return nil
		}
		copyID := c.t.ack(m)
		if c.settled != nil {
			c.settled(copyID)
		}
	}
	return nil
}

// SendNacks passes the nacks on: those messages come again at once.
func (c *pubsubConn) SendNacks(_ context.Context, ids []driver.AckID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if m := c.held[id.(int)]; m != nil && !c.killed {
			m.Nack()
		}
		delete(c.held, id.(int))
	}
	return nil
}

func (c *pubsubConn) CanNack() bool                    { return true }
func (*pubsubConn) IsRetryable(error) bool             { return false }
func (*pubsubConn) As(any) bool                        { return false }
func (*pubsubConn) ErrorAs(error, any) bool            { return false }
func (*pubsubConn) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Unknown }
func (*pubsubConn) Close() error                       { return nil }

// copyOfMetadata returns the copy id a message carries.
func copyOfMetadata(md map[string]string) int64 {
	if id, err := strconv.ParseInt(md[copyHeader], 10, 64); err == nil {
		return id
	}
	return -1
}

// naivePubsub is the usual hand-written Receive/Ack loop around the naive
// check-then-act: each worker receives a message, checks then credits, and
// acks after the database has committed. A crash between the two leaves
// the message unacked, and the service delivers it again after its ack
// deadline.
func (s *store) naivePubsub(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn := bc.(*pubsubConn)
		conn.watch(sc, nil)
		var crashed atomic.Bool
		var wg sync.WaitGroup
		for range sc.workers {
			wg.Go(func() {
				for ctx.Err() == nil && !crashed.Load() {
					m, err := conn.sub.Receive(ctx)
					if err != nil {
						return // the run's end, or the crash
					}
					// A crash: committed, and the process dies before its
					// ack leaves.
					if !sc.naiveDeliver(ctx, apply, m.Body, &crashed, conn.crash) {
						m.Nack() // not processed; a crashed process's client sends nothing
						return
					}
					m.Ack()
				}
			})
		}
		wg.Wait()
		if crashed.Load() {
			return errCrashed
		}
		return nil
	}, credited, nil
}

// libraryPubsub is the same consumer through cdkpubsub.NewConsumer: the
// claim and the credit in one transaction, then the ack.
func (s *store) libraryPubsub(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	// The key is the order id from the body: a natural key that survives
	// a replay tool assigning new message ids (the idempotency-key
	// metadata key).
	key := cdkpubsub.Prefixed("order-completed:", cdkpubsub.BodyField("order_id"))
	h := cdkpubsub.Decode(cdkpubsub.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *pubsub.Message) error {
		// The Consumer opens the transaction before the handler runs, so
		// the price lookup waits inside it here.
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn := bc.(*pubsubConn)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		// Every message whose transaction committed is acked; every
		// crashEvery-th ack, the process dies before it leaves.
		conn.watch(sc, func() bool {
			if n := sc.acks.Add(1); sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 && !crashed.Swap(true) {
				sc.crashes.Add(1)
				cancel()
				return true
			}
			return false
		})
		obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			switch e.Type {
			case adapter.EventDuplicate:
				sc.duplicates.Add(1)
				fallthrough
			case adapter.EventApplied, adapter.EventRequeued, adapter.EventDeadLettered:
				sc.deliveries.Add(1)
			}
		})
		c, err := cdkpubsub.NewConsumer(mw, h, cdkpubsub.WithKey(key), cdkpubsub.WithWorkers(sc.workers),
			cdkpubsub.WithObserver(obs), cdkpubsub.WithShutdownTimeout(time.Millisecond),
			cdkpubsub.WithRetryDelay(10*time.Millisecond, time.Second))
		if err != nil {
			return err
		}
		err = c.Run(pctx, conn.sub)
		if crashed.Load() {
			return errCrashed
		}
		return err
	}, credited, nil
}
