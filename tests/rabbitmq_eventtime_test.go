package tests

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// settleLog records a Consumer's settlements by message id.
type settleLog struct {
	mu sync.Mutex
	by map[string][]rabbitmq.Settlement
}

func (s *settleLog) record(_ context.Context, st rabbitmq.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string][]rabbitmq.Settlement{}
	}
	s.by[st.Delivery.MessageId] = append(s.by[st.Delivery.MessageId], st)
}

// actions returns the actions of id's settlements, in order.
func (s *settleLog) actions(id string) []rabbitmq.Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	var a []rabbitmq.Action
	for _, st := range s.by[id] {
		a = append(a, st.Action)
	}
	return a
}

// first returns id's first settlement.
func (s *settleLog) first(id string) rabbitmq.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.by[id]) == 0 {
		return rabbitmq.Settlement{}
	}
	return s.by[id][0]
}

// last returns id's last settlement.
func (s *settleLog) last(id string) rabbitmq.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := s.by[id]
	if len(all) == 0 {
		return rabbitmq.Settlement{}
	}
	return all[len(all)-1]
}

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
	l.db.SetMaxOpenConns(4)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	o := orderCompleted{OrderID: 9912, CustomerID: 12, TotalCents: 5000}
	produced := eventOrderMessage(t, o, now.Add(-24*time.Hour))
	produced.Timestamp = now.Add(-24 * time.Hour)
	resent := eventOrderMessage(t, o, now.Add(-24*time.Hour))
	resent.Timestamp = now // the re-send's transport time, after midnight
	newPublisher(t, admin, top.queue).publish(t, produced, resent)

	c, err := rabbitmq.NewConsumer(top.queue, l.eventOrderHandler(t), rabbitmq.WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntil(t, c, dialTest(t, url), "both acked", func() bool {
		s := c.Stats()
		return s.Acked+s.DeadLettered+s.Requeued >= 2
	}); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Applied != 1 || s.Duplicates != 1 || s.Acked != 2 {
		t.Fatalf("stats %+v, want 1 applied and 1 duplicate, both acked", s)
	}
	if got, want := partitionOf(t, l, o.key()), l.schema+".processed_messages_p20310314"; got != want {
		t.Fatalf("claim in %s, want %s (the producer's event day)", got, want)
	}
	if n := count(t, l.db, "SELECT count(*) FROM "+quoteTable(l.schema+".processed_messages")); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
	if b, n := l.balance(t, 12), l.ledgerRows(t, 9912); b != pointsFor(o) || n != 1 {
		t.Fatalf("balance %d with %d ledger rows, want %d with 1", b, n, pointsFor(o))
	}
}

// TestRabbitMQPartitionedWithoutProducerTimeIsRefused (issue 21, case 2): a
// Handler for a partitioned claim table whose event time would come from
// the transport (the AMQP timestamp) is refused when it is built, with an
// error naming the problem — no panic, and no delivery ever terminated.
func TestRabbitMQPartitionedWithoutProducerTimeIsRefused(t *testing.T) {
	t.Parallel()
	l, _ := partitionedLoyalty(t, time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC), 1)
	credit := func(context.Context, *sql.Tx, *amqp.Delivery) error {
		t.Error("the handler ran")
		return nil
	}
	for name, build := range map[string]func() (rabbitmq.Handler, error){
		"Process": func() (rabbitmq.Handler, error) {
			return rabbitmq.Process(l.mw, rabbitmq.MessageID(), credit, rabbitmq.WithTransportEventTime())
		},
		"Decode": func() (rabbitmq.Handler, error) {
			return rabbitmq.Decode(l.mw, rabbitmq.MessageID(), rabbitmq.JSON[orderCompleted], l.credit, rabbitmq.WithTransportEventTime())
		},
	} {
		h, err := build()
		if h != nil || !errors.Is(err, adapter.ErrNoProducerEventTime) {
			t.Fatalf("%s: handler %v, error %v; want no handler and ErrNoProducerEventTime", name, h != nil, err)
		}
		t.Logf("%s: %v", name, err)
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
	l.db.SetMaxOpenConns(4)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	soon := orderCompleted{OrderID: 31, CustomerID: 13, TotalCents: 3100}
	far := orderCompleted{OrderID: 32, CustomerID: 13, TotalCents: 3200}
	soonAt := now.Add(30 * time.Minute)
	farAt := soonAt.Add(idempotent.DefaultClockSkew + adapter.DefaultFutureBound + time.Hour) // beyond the bound even after the clock moves
	newPublisher(t, admin, top.queue).publish(t, eventOrderMessage(t, soon, soonAt), eventOrderMessage(t, far, farAt))

	var log settleLog
	var catchUp sync.Once
	c, err := rabbitmq.NewConsumer(top.queue, l.eventOrderHandler(t),
		rabbitmq.WithWorkers(1), rabbitmq.WithRequeueDelay(10*time.Millisecond),
		rabbitmq.WithOnSettle(func(ctx context.Context, s rabbitmq.Settlement) {
			log.record(ctx, s)
			if s.Delivery.MessageId == soon.key() && s.Action == rabbitmq.Requeued {
				// Nothing may be written while it waits.
				if n := l.ledgerRows(t, soon.OrderID); n != 0 {
					t.Errorf("%d ledger rows for the requeued message", n)
				}
				catchUp.Do(func() { clock.Set(soonAt) })
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntil(t, c, dialTest(t, url), "both acked or dead-lettered", func() bool {
		s := c.Stats()
		return s.Acked+s.DeadLettered >= 2
	}); err != nil {
		t.Fatal(err)
	}
	acts := log.actions(soon.key())
	if len(acts) < 2 || acts[0] != rabbitmq.Requeued || acts[len(acts)-1] != rabbitmq.Acked {
		t.Fatalf("the message %v ahead: %v, want requeued, then acked", soonAt.Sub(now), acts)
	}
	if st := log.last(soon.key()); st.Outcome != idempotent.Applied {
		t.Fatalf("the message %v ahead ended %v, want applied", soonAt.Sub(now), st.Outcome)
	}
	if st := log.first(soon.key()); !errors.Is(st.Err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("requeued with %v, want ErrInvalidEventTime", st.Err)
	}
	if acts := log.actions(far.key()); len(acts) != 1 || acts[0] != rabbitmq.DeadLettered {
		t.Fatalf("the message %v ahead: %v, want dead-lettered once", farAt.Sub(now), acts)
	}
	if b, n, nf := l.balance(t, 13), l.ledgerRows(t, soon.OrderID), l.ledgerRows(t, far.OrderID); b != pointsFor(soon) || n != 1 || nf != 0 {
		t.Fatalf("balance %d, %d and %d ledger rows; want %d, 1 and 0", b, n, nf, pointsFor(soon))
	}
	if n := count(t, l.db, "SELECT count(*) FROM "+quoteTable(l.schema+".processed_messages")); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
	// The broker's dead-lettering keeps the producer's event time.
	ch := openChannel(t, admin)
	dead, ok, err := ch.Get(top.dlq, true)
	if err != nil || !ok {
		t.Fatalf("dead-letter queue: %v (got one: %v)", err, ok)
	}
	if dead.MessageId != far.key() || dead.Headers[adapter.EventTimeHeader] != adapter.FormatEventTime(farAt) {
		t.Fatalf("dead letter %q with event time %v, want %q with %s", dead.MessageId, dead.Headers[adapter.EventTimeHeader], far.key(), adapter.FormatEventTime(farAt))
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
	db := openDB(t)
	db.SetMaxOpenConns(4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	good := orderCompleted{OrderID: 41, CustomerID: 14, TotalCents: 4100}
	bad := orderCompleted{OrderID: 42, CustomerID: 14, TotalCents: 4200}
	badMsg := orderMessage(t, bad)
	badMsg.Headers = amqp.Table{adapter.EventTimeHeader: "1773489600"}
	newPublisher(t, admin, top.queue).publish(t, badMsg, eventOrderMessage(t, good, time.Now().Add(-time.Minute)))

	var log settleLog
	c, err := rabbitmq.NewConsumer(top.queue, l.orderHandler(t), rabbitmq.WithWorkers(1), rabbitmq.WithOnSettle(log.record))
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntil(t, c, dialTest(t, url), "both settled", func() bool {
		s := c.Stats()
		return s.Acked+s.DeadLettered >= 2
	}); err != nil {
		t.Fatal(err)
	}
	if acts := log.actions(bad.key()); len(acts) != 1 || acts[0] != rabbitmq.DeadLettered {
		t.Fatalf("the bad header: %v, want dead-lettered once", acts)
	}
	if err := log.last(bad.key()).Err; !errors.Is(err, adapter.ErrBadEventTime) || !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("dead-lettered with %v, want ErrBadEventTime", err)
	}
	if st := log.last(good.key()); st.Action != rabbitmq.Acked || st.Outcome != idempotent.Applied {
		t.Fatalf("the good header: %v %v, want acked, applied", st.Action, st.Outcome)
	}
	if b, n := l.balance(t, 14), l.ledgerRows(t, bad.OrderID); b != pointsFor(good) || n != 0 {
		t.Fatalf("balance %d with %d ledger rows for the poison, want %d with none", b, n, pointsFor(good))
	}
	waitFor(t, "the dead letter", func() (bool, error) { return depth(t, admin, top.dlq) == 1, nil })
}
