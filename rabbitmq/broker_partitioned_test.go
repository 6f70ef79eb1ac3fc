package rabbitmq_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// eventOrderMessage is orderMessage with the producer's event time in the
// adapter.EventTimeHeader header.
func eventOrderMessage(t testing.TB, o order, at time.Time) amqp.Publishing {
	t.Helper()
	m := orderMessage(t, o)
	m.Headers = amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(at)}
	return m
}

// TestRabbitMQPartitionedCrashAfterCommitBeforeAckIsRedeliveredAsDuplicate:
// the adapter in partitioned mode commits the credit, the process dies
// before its ack, and the broker redelivers the message the next day (by
// the consumer's clock). The event time, not the day of processing, picks
// the partition, so the redelivery meets the claim: Duplicate, one credit.
func TestRabbitMQPartitionedCrashAfterCommitBeforeAckIsRedeliveredAsDuplicate(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	now := time.Date(2031, 3, 14, 23, 30, 0, 0, time.UTC)
	l, clock := partitionedLoyalty(t, now, 2)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	msg := order{OrderID: 9913, CustomerID: 8, Points: 50}
	newPublisher(t, admin, top.queue).publish(t, eventOrderMessage(t, msg, now.Add(-time.Hour)))

	var log settlements
	first := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := crashAfterCommit(t, url, top.queue, first); !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("first Run: %v, want ErrChannelClosed", err)
	}
	if s := first.Stats(); s.Applied != 1 || s.SettleFailed != 1 {
		t.Fatalf("first consumer: %+v, want 1 applied whose ack failed", s)
	}
	wantPart := l.schema + ".processed_messages_p20310314"
	if got := partitionOf(t, l, msg.Key()); got != wantPart {
		t.Fatalf("claim in %s, want %s (the event's day)", got, wantPart)
	}

	clock.Add(24 * time.Hour) // the redelivery is processed on 15 March
	second := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := runUntil(t, second, dialTest(t, url), top.queue, "the redelivery's ack", func() bool { return second.Stats().Duplicates == 1 }); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	want := []seen{{adapter.EventApplied, false}, {adapter.EventDuplicate, true}}
	if got := log.outcomes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("deliveries (outcome, redelivered) %v, want %v", got, want)
	}
	if b, n := l.balance(t, 8), l.ledgerRows(t, 9913); b != msg.Points || n != 1 {
		t.Fatalf("balance %d with %d ledger rows, want %d with 1", b, n, msg.Points)
	}
	if n := depth(t, admin, top.queue); n != 0 {
		t.Fatalf("%d messages left in the queue, want 0", n)
	}
}

// TestRabbitMQPartitionedFenceDeadLetters: in partitioned mode, a message
// older than the retention window and one whose event time cannot be read
// are poison: dead-lettered, with nothing written, while a message of today
// is applied.
func TestRabbitMQPartitionedFenceDeadLetters(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, _ := partitionedLoyalty(t, now, 1)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	good := order{OrderID: 21, CustomerID: 9, Points: 12}
	old := order{OrderID: 22, CustomerID: 9, Points: 9}
	unstamped := order{OrderID: 23, CustomerID: 9, Points: 7}
	newPublisher(t, admin, top.queue).publish(t,
		eventOrderMessage(t, old, now.Add(-idempotent.DefaultRetention-time.Hour)),
		orderMessage(t, unstamped),
		eventOrderMessage(t, good, now.Add(-time.Minute)))

	var log settlements
	c := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := runUntil(t, c, dialTest(t, url), top.queue, "all three settled", func() bool {
		s := c.Stats()
		return s.Applied+s.DeadLettered == 3
	}); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 1, DeadLettered: 2}) {
		t.Fatalf("stats %+v, want 1 applied and acked, 2 dead-lettered", s)
	}
	for id, want := range map[string]error{old.Key(): idempotent.ErrBeyondRetention, unstamped.Key(): adapter.ErrNoEventTime} {
		if e := log.last(id); e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, want) {
			t.Errorf("message %q settled %v with %v, want dead-lettered with %v", id, e.Type, e.Err, want)
		}
	}
	waitFor(t, "two messages in the dead-letter queue", func() bool { return depth(t, admin, top.dlq) == 2 })
	if n := l.count(t, "SELECT count(*) FROM $S.processed_messages"); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
	if b, n := l.balance(t, 9), l.ledgerRows(t, 22)+l.ledgerRows(t, 23); b != good.Points || n != 0 {
		t.Fatalf("balance %d with %d ledger rows for the poison, want %d with none", b, n, good.Points)
	}
}
