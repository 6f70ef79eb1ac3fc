package cdkpubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
)

// A poison message becomes one dead-letter outbox row before it is acked,
// even when the ack is lost and the message comes again; a message without
// a key gets a row too. A relay publishes both to the dead-letter topic
// with the original key and event time, and the error.
func TestDeadLetterThroughTheOutbox(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ob := l.outbox(t)
	const kind = "loyalty.dead-letter"
	b := newMemBroker(t, 300*time.Millisecond)
	rec := testenv.NewRecorder()
	c, err := cdkpubsub.NewConsumer(l.mw, l.handler(), cdkpubsub.WithDeadLetter(ob, kind), cdkpubsub.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC)
	ctx := context.Background()
	const poison = "order-completed:13"
	if err := b.send(ctx, poison, map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(at)}, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if err := b.topic.Send(ctx, &pubsub.Message{Body: []byte(`{"order_id": 14}`)}); err != nil { // no key
		t.Fatal(err)
	}

	first := start(c, b, &memProc{crashAt: func(key string) bool { return key == poison }})
	rec.Until(t, 10*time.Second, "dead at the poison message's ack", first.proc.dead)
	first.stop(t)
	second := start(c, b, &memProc{})
	rec.Until(t, 10*time.Second, "both dead-lettered, the poison one twice", func() bool {
		return rec.Count(adapter.EventDeadLettered, poison) == 2 && rec.Count(adapter.EventDeadLettered, "") >= 1
	})
	second.stop(t)
	if n := testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.outbox"); n != 2 {
		t.Fatalf("%d dead-letter rows, want 2: one per poison message, however often it came", n)
	}
	testenv.AuditLedger(t, l.db, l.schema, 0, nil)

	got := map[string]*pubsub.Message{}
	for _, m := range relayDeadLetters(t, ob, kind, 2) {
		got[m.Metadata[cdkpubsub.DefaultKeyMetadata]] = m
	}
	m := got[poison]
	if m == nil {
		t.Fatalf("no dead letter keyed %q: %v", poison, got)
	}
	if string(m.Body) != "not json" || m.Metadata[adapter.EventTimeHeader] != adapter.FormatEventTime(at) ||
		m.Metadata[cdkpubsub.DeadLetterIDMetadata] == "" || m.Metadata[cdkpubsub.DeadLetterErrorMetadata] == "" {
		t.Fatalf("dead letter %q: body %q, metadata %v", poison, m.Body, m.Metadata)
	}
	if m := got[""]; m == nil || string(m.Body) != `{"order_id": 14}` || m.Metadata[cdkpubsub.DeadLetterIDMetadata] == "" {
		t.Fatalf("dead letter of the keyless message: %+v", m)
	}
}

// On a claim table partitioned by event day, a message dated
// 23:59:59.9999996Z whose first delivery is poison is dead-lettered through
// the outbox, and DeadLetterSender publishes it with its event time
// unchanged; that dead letter, replayed into the topic, and a re-send of
// the original are then one claim, on the message's day, and one effect.
func TestDeadLetterReplayKeepsEventDay(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	at := day.Add(24*time.Hour - 400*time.Nanosecond)
	clk := testenv.NewClock(day.Add(24*time.Hour + 30*time.Second))
	l := newLedger(t, idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2), idempotent.WithClock(clk.Now))
	ctx := context.Background()
	ob := l.outbox(t)
	const kind = "loyalty.dead-letter"
	b := newMemBroker(t, time.Minute)
	rec := testenv.NewRecorder()
	var refused atomic.Bool
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if !refused.Swap(true) {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithDeadLetter(ob, kind), cdkpubsub.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 1, CustomerID: 1, Points: 5}
	sendOrder(t, b, o, at)
	pr := start(c, b, &memProc{})
	rec.Until(t, 10*time.Second, "the message dead-lettered", func() bool { return rec.Count(adapter.EventDeadLettered, o.Key()) == 1 })

	dl := relayDeadLetters(t, ob, kind, 1)[0]
	if v := dl.Metadata[adapter.EventTimeHeader]; v != adapter.FormatEventTime(at) {
		t.Errorf("the dead letter's event time is %s, want the message's %s", v, adapter.FormatEventTime(at))
	}
	if err := b.topic.Send(ctx, &pubsub.Message{Body: dl.Body, Metadata: dl.Metadata}); err != nil {
		t.Fatal(err)
	}
	sendOrder(t, b, o, at)
	rec.Until(t, 10*time.Second, "the replay and the re-send settled", func() bool {
		return rec.Count(adapter.EventApplied, o.Key())+rec.Count(adapter.EventDuplicate, o.Key()) == 2
	})
	pr.stop(t)
	if days := testenv.ClaimDays(t, l.db, l.schema, o.Key()); !slices.Equal(days, []string{"2026-11-30"}) {
		t.Errorf("claims of %s on days %v, want [2026-11-30]", o.Key(), days)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// On a driver that cannot Nack, a requeued message is left unacked and
// comes again at its ack deadline, to be applied then.
func TestRequeueWithoutNackWaitsForTheAckDeadline(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	b := newMemBroker(t, 200*time.Millisecond)
	rec := testenv.NewRecorder()
	var runs atomic.Int32
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if runs.Add(1) == 1 {
			return errors.New("the points service is down")
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithObserver(rec), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 21, CustomerID: 8, Points: 5}
	sendOrder(t, b, o, time.Now())
	pr := start(c, b, &memProc{noNack: true})
	rec.Until(t, 10*time.Second, "applied after the ack deadline", func() bool { return rec.Count(adapter.EventApplied, o.Key()) == 1 })
	pr.stop(t)
	if n := rec.Count(adapter.EventRequeued, o.Key()); n != 1 {
		t.Errorf("%d Requeued, want 1", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// A dead letter that cannot be written (here: the outbox table is not
// there yet) leaves the poison message unacked, requeued, rather than
// dropped; once the table exists, its next delivery is dead-lettered.
func TestDeadLetterNotWrittenIsRequeued(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ob, err := outbox.New(l.db, "loyalty", outbox.WithTable(l.schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	b := newMemBroker(t, 300*time.Millisecond)
	rec := testenv.NewRecorder()
	c, err := cdkpubsub.NewConsumer(l.mw, l.handler(), cdkpubsub.WithDeadLetter(ob, "loyalty.dead-letter"), cdkpubsub.WithObserver(rec),
		cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const poison = "order-completed:15"
	if err := b.send(context.Background(), poison, nil, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	pr := start(c, b, &memProc{})
	rec.Until(t, 10*time.Second, "requeued after a failed dead letter", func() bool {
		return rec.Count(adapter.EventSettleFailed, poison) >= 1 && rec.Count(adapter.EventRequeued, poison) >= 1
	})
	if n := rec.Count(adapter.EventDeadLettered, poison); n != 0 {
		t.Fatalf("%d dead-lettered without a dead letter written", n)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec.Until(t, 10*time.Second, "dead-lettered once the outbox exists", func() bool { return rec.Count(adapter.EventDeadLettered, poison) == 1 })
	pr.stop(t)
	if n := testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.outbox"); n != 1 {
		t.Fatalf("%d dead-letter rows, want 1", n)
	}
}
