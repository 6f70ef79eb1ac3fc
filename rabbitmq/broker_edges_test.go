package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestRabbitMQMissingPartitionIsRequeuedNotDeadLettered: in partitioned
// mode, a message whose day is inside the window but whose partition
// MaintainPartitions has not created yet is not possible yet, not too old:
// the consumer requeues it (with its bounded delay) instead of
// dead-lettering it, and it applies once the partition exists.
func TestRabbitMQMissingPartitionIsRequeuedNotDeadLettered(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	l, clock := partitionedLoyalty(t, time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC), 1) // days up to 15 March
	clock.Add(2 * 24 * time.Hour)                                                       // 16 March, and MaintainPartitions has not run
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	msg := order{OrderID: 1603, CustomerID: 16, Points: 31}
	pub := eventOrderMessage(t, msg, clock.Now().Add(-time.Hour)) // the producer's event time
	newPublisher(t, admin, top.queue).publish(t, pub)

	// The adapter in partitioned mode: key from message_id, event time
	// from the Idempotent-Event-Time header.
	settled := make(chan adapter.Event)
	stop := make(chan struct{})
	defer close(stop)
	c := l.orderConsumer(t, rabbitmq.WithRetryDelay(20*time.Millisecond, 20*time.Millisecond),
		rabbitmq.WithObserver(adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			select {
			case settled <- e: // the worker waits for the test to look
			case <-stop:
			}
		})))
	ch := openChannel(t, dialTest(t, url))
	defer ch.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Run(ctx, ch, top.queue) }()
	next := func(what string) adapter.Event {
		t.Helper()
		select {
		case s := <-settled:
			return s
		case err := <-res:
			t.Fatalf("Run returned before %s: %v", what, err)
		case <-time.After(60 * time.Second):
			t.Fatalf("timed out waiting for %s (stats %+v)", what, c.Stats())
		}
		return adapter.Event{}
	}
	first := next("the first settlement")
	if first.Type != adapter.EventRequeued || !errors.Is(first.Err, idempotent.ErrNoPartition) {
		t.Fatalf("first delivery settled as %v (%v), want requeued: the day's partition is only not there yet", first.Type, first.Err)
	}
	t.Logf("first delivery requeued: %v", first.Err)
	if _, err := l.mw.ClaimTable().MaintainPartitions(context.Background()); err != nil {
		t.Fatal(err)
	}
	for {
		e := next("the ack")
		if e.Type == adapter.EventApplied {
			break
		}
		if e.Type != adapter.EventRequeued {
			t.Fatalf("settled as %v (%v), want requeued until the partition exists, then applied", e.Type, e.Err)
		}
	}
	cancel()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.DeadLettered != 0 || s.Applied != 1 {
		t.Fatalf("stats %+v, want nothing dead-lettered and one applied", s)
	}
	if n := depth(t, admin, top.dlq); n != 0 {
		t.Fatalf("%d messages in the dead-letter queue", n)
	}
	if b, n := l.balance(t, 16), l.ledgerRows(t, 1603); b != msg.Points || n != 1 {
		t.Fatalf("balance %d with %d ledger rows, want %d with 1", b, n, msg.Points)
	}
}
