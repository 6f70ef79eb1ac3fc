package rabbitmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestRabbitMQResendAcrossMidnightIsDuplicate (issue 21, case 1): on a
// day-partitioned claim table, a message produced at now−24h and re-sent at
// now — a new publish with a new AMQP timestamp, as an application retry or
// a relay makes it, but the producer's Idempotent-Event-Time header kept —
// claims in the same day's partition: one Applied, one Duplicate, one
// effect.
func TestRabbitMQResendAcrossMidnightIsDuplicate(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	now := time.Date(2031, 3, 15, 0, 30, 0, 0, time.UTC)
	l, _ := partitionedLoyalty(t, now, 1)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	o := order{OrderID: 9912, CustomerID: 12, Points: 50}
	produced := eventOrderMessage(t, o, now.Add(-24*time.Hour))
	produced.Timestamp = now.Add(-24 * time.Hour)
	resent := eventOrderMessage(t, o, now.Add(-24*time.Hour))
	resent.Timestamp = now // the re-send's transport time, after midnight
	newPublisher(t, admin, top.queue).publish(t, produced, resent)

	c := l.orderConsumer(t)
	if err := runUntil(t, c, dialTest(t, url), top.queue, "both settled", func() bool {
		s := c.Stats()
		return s.Applied+s.Duplicates+s.DeadLettered+s.Requeued >= 2
	}); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 1, Duplicates: 1}) {
		t.Fatalf("stats %+v, want 1 applied and 1 duplicate, both acked", s)
	}
	if got, want := partitionOf(t, l, o.Key()), l.schema+".processed_messages_p20310314"; got != want {
		t.Fatalf("claim in %s, want %s (the producer's event day)", got, want)
	}
	if n := l.count(t, "SELECT count(*) FROM $S.processed_messages"); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
	if b, n := l.balance(t, 12), l.ledgerRows(t, 9912); b != o.Points || n != 1 {
		t.Fatalf("balance %d with %d ledger rows, want %d with 1", b, n, o.Points)
	}
}

// TestRabbitMQPartitionedWithoutProducerTimeIsRefused (issue 21, case 2): a
// Consumer for a partitioned claim table whose event time would come from
// the transport (the AMQP timestamp), or from nowhere, is refused when it
// is built, with an error naming the problem — no panic, and no delivery
// ever terminated.
func TestRabbitMQPartitionedWithoutProducerTimeIsRefused(t *testing.T) {
	t.Parallel()
	l, _ := partitionedLoyalty(t, time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC), 1)
	for name, opt := range map[string]rabbitmq.Option{
		"WithTransportEventTime": rabbitmq.WithTransportEventTime(),
		"WithoutEventTime":       rabbitmq.WithoutEventTime(),
	} {
		c, err := rabbitmq.NewConsumer(l.mw, l.orderHandler(), opt)
		if c != nil || !errors.Is(err, adapter.ErrNoProducerEventTime) {
			t.Fatalf("%s: consumer %v, error %v; want no consumer and ErrNoProducerEventTime", name, c != nil, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// The producer's header, the default, is accepted.
	if _, err := rabbitmq.NewConsumer(l.mw, l.orderHandler()); err != nil {
		t.Fatal(err)
	}
}

// TestRabbitMQFutureDatedIsRequeuedUntilTheClockCatchesUp (issue 21, case
// 3): a message dated ahead of the Middleware's clock, within the bound, is
// requeued, nothing written, and applies once the clock has caught up; one
// dated beyond the bound is dead-lettered exactly once, nothing written, and
// reaches the dead-letter queue with its event-time header.
func TestRabbitMQFutureDatedIsRequeuedUntilTheClockCatchesUp(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, clock := partitionedLoyalty(t, now, 1)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	soon := order{OrderID: 31, CustomerID: 13, Points: 31}
	far := order{OrderID: 32, CustomerID: 13, Points: 32}
	soonAt := now.Add(30 * time.Minute)
	farAt := soonAt.Add(idempotent.DefaultClockSkew + adapter.DefaultFutureBound + time.Hour) // beyond the bound even after the clock moves
	newPublisher(t, admin, top.queue).publish(t, eventOrderMessage(t, soon, soonAt), eventOrderMessage(t, far, farAt))

	var log settlements
	var catchUp sync.Once
	c := l.orderConsumer(t, rabbitmq.WithRetryDelay(10*time.Millisecond, 10*time.Millisecond),
		rabbitmq.WithObserver(adapter.ObserverFunc(func(ctx context.Context, e adapter.Event) {
			log.Observe(ctx, e)
			if e.Message.Key == soon.Key() && e.Type == adapter.EventRequeued {
				// Nothing may be written while it waits.
				if n := l.ledgerRows(t, soon.OrderID); n != 0 {
					t.Errorf("%d ledger rows for the requeued message", n)
				}
				catchUp.Do(func() { clock.Set(soonAt) })
			}
		})))
	if err := runUntil(t, c, dialTest(t, url), top.queue, "both applied or dead-lettered", func() bool {
		s := c.Stats()
		return s.Applied+s.DeadLettered >= 2
	}); err != nil {
		t.Fatal(err)
	}
	acts := log.types(soon.Key())
	if len(acts) < 2 || acts[0] != adapter.EventRequeued || acts[len(acts)-1] != adapter.EventApplied {
		t.Fatalf("the message %v ahead: %v, want requeued, then applied", soonAt.Sub(now), acts)
	}
	if e := log.first(soon.Key()); !errors.Is(e.Err, idempotent.ErrInvalidEventTime) || e.Delay <= 0 || e.Delay > 10*time.Millisecond {
		t.Fatalf("requeued with %v after %v, want ErrInvalidEventTime after at most the retry delay's maximum", e.Err, e.Delay)
	}
	if acts := log.types(far.Key()); len(acts) != 1 || acts[0] != adapter.EventDeadLettered {
		t.Fatalf("the message %v ahead: %v, want dead-lettered once", farAt.Sub(now), acts)
	}
	if b, n, nf := l.balance(t, 13), l.ledgerRows(t, soon.OrderID), l.ledgerRows(t, far.OrderID); b != soon.Points || n != 1 || nf != 0 {
		t.Fatalf("balance %d, %d and %d ledger rows; want %d, 1 and 0", b, n, nf, soon.Points)
	}
	if n := l.count(t, "SELECT count(*) FROM $S.processed_messages"); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
	// The broker's dead-lettering keeps the producer's event time.
	ch := openChannel(t, admin)
	dead, ok, err := ch.Get(top.dlq, true)
	if err != nil || !ok {
		t.Fatalf("dead-letter queue: %v (got one: %v)", err, ok)
	}
	if dead.MessageId != far.Key() || dead.Headers[adapter.EventTimeHeader] != adapter.FormatEventTime(farAt) {
		t.Fatalf("dead letter %q with event time %v, want %q with %s", dead.MessageId, dead.Headers[adapter.EventTimeHeader], far.Key(), adapter.FormatEventTime(farAt))
	}
}

// TestRabbitMQBadEventTimeHeaderIsPoison (issue 21, event times from the
// producer): an Idempotent-Event-Time header that is not an RFC 3339 time
// — here the Unix seconds a producer might write — is poison, on a plain
// claim table too: dead-lettered once, nothing written, while a message
// with a good header is applied.
func TestRabbitMQBadEventTimeHeaderIsPoison(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	good := order{OrderID: 41, CustomerID: 14, Points: 41}
	bad := order{OrderID: 42, CustomerID: 14, Points: 42}
	badMsg := orderMessage(t, bad)
	badMsg.Headers = amqp.Table{adapter.EventTimeHeader: "1773489600"}
	newPublisher(t, admin, top.queue).publish(t, badMsg, eventOrderMessage(t, good, time.Now().Add(-time.Minute)))

	var log settlements
	c := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := runUntil(t, c, dialTest(t, url), top.queue, "both settled", func() bool {
		s := c.Stats()
		return s.Applied+s.DeadLettered >= 2
	}); err != nil {
		t.Fatal(err)
	}
	if acts := log.types(bad.Key()); len(acts) != 1 || acts[0] != adapter.EventDeadLettered {
		t.Fatalf("the bad header: %v, want dead-lettered once", acts)
	}
	if err := log.last(bad.Key()).Err; !errors.Is(err, adapter.ErrBadEventTime) || !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("dead-lettered with %v, want ErrBadEventTime", err)
	}
	if acts := log.types(good.Key()); len(acts) != 1 || acts[0] != adapter.EventApplied {
		t.Fatalf("the good header: %v, want applied", acts)
	}
	if b, n := l.balance(t, 14), l.ledgerRows(t, bad.OrderID); b != good.Points || n != 0 {
		t.Fatalf("balance %d with %d ledger rows for the poison, want %d with none", b, n, good.Points)
	}
	waitFor(t, "the dead letter", func() bool { return depth(t, admin, top.dlq) == 1 })
}
