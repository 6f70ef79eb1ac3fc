package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestRabbitMQDeadLetterWorkflow: with WithDeadLetter a poison delivery is
// written as an outbox dead letter and acked (the queue's dead-letter
// exchange gets nothing), listed by a deadletter.Store with its reason,
// queue and event time, published by DeadLetterSender to the dead-letter
// queue, replayed after the fix through ReplaySender with its message id
// and event time and applied once, replayed again and a Duplicate, then
// discarded and recorded.
func TestRabbitMQDeadLetterWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := amqpURL(t)
	db := openDB(t, 4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	ob := testenv.Outbox(t, db, l.schema, "loyalty")

	var broken atomic.Bool
	broken.Store(true)
	credit := l.orderHandler()
	c, err := rabbitmq.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if broken.Load() {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, d)
	}, rabbitmq.WithDeadLetter(ob, "", top.dlq))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 11, CustomerID: 4, Points: 7}
	at := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	msg := orderMessage(t, o)
	msg.Headers = amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(at)}
	newPublisher(t, admin, top.queue).publish(t, msg)
	if err := runUntil(t, c, dialTest(t, url), top.queue, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 }); err != nil {
		t.Fatal(err)
	}
	if n := depth(t, admin, top.dlq); n != 0 {
		t.Fatalf("%d messages in the dead-letter queue before any relay: the delivery was rejected to the DLX", n)
	}

	store, err := deadletter.New(db, deadletter.WithTable(l.schema+".outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	list, _, err := store.List(ctx, deadletter.Filter{Topic: top.queue})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v; want one dead letter", list, err)
	}
	dl := list[0]
	if dl.Kind != rabbitmq.DeadLetterKind || !strings.Contains(dl.Reason, "the ledger refused the order") || !dl.EventTime.Equal(at) ||
		dl.Key != top.queue+"/"+o.Key() || dl.Destination != "/"+top.dlq {
		t.Fatalf("dead letter %+v: want kind %s, the reason, event time %v, key %s/%s", dl, rabbitmq.DeadLetterKind, at, top.queue, o.Key())
	}

	pub := openChannel(t, admin)
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender(rabbitmq.DeadLetterKind, rabbitmq.DeadLetterSender(pub)),
		outbox.WithSender(rabbitmq.ReplayKind, rabbitmq.ReplaySender(pub)), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	get := openChannel(t, admin)
	var dm amqp.Delivery
	for ok, deadline := false, time.Now().Add(time.Minute); !ok; {
		if dm, ok, err = get.Get(top.dlq, true); err != nil {
			t.Fatal(err)
		} else if !ok && time.Now().After(deadline) {
			t.Fatal("no dead letter in the dead-letter queue")
		} else if !ok {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if dm.MessageId != o.Key() || dm.Headers[rabbitmq.DeadLetterIDHeader] != dl.IdempotencyKey ||
		dm.Headers[adapter.EventTimeHeader] != adapter.FormatEventTime(at) || string(dm.Body) != string(msg.Body) {
		t.Fatalf("dead letter published as %q with headers %v", dm.MessageId, dm.Headers)
	}

	broken.Store(false)
	for i, cond := range []func(adapter.Stats) bool{
		func(s adapter.Stats) bool { return s.Applied == 1 },
		func(s adapter.Stats) bool { return s.Duplicates == 1 },
	} {
		if _, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{dl.ID}}, "ops"); err != nil {
			t.Fatal(err)
		}
		if err := runUntil(t, c, dialTest(t, url), top.queue, "the replay settled", func() bool { return cond(c.Stats()) }); err != nil {
			t.Fatal(err)
		}
		if s := c.Stats(); s.Applied != 1 || s.Duplicates != int64(i) || s.DeadLettered != 1 {
			t.Fatalf("replay %d: stats %+v, want 1 applied, %d duplicates, 1 dead-lettered", i+1, s, i)
		}
	}
	if b := l.balance(t, o.CustomerID); b != o.Points {
		t.Fatalf("balance %d, want %d: the order applied once", b, o.Points)
	}

	if _, err := store.Discard(ctx, deadletter.Filter{IDs: []int64{dl.ID}}, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Show(ctx, dl.ID); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("Show after Discard: %v, want ErrNotFound", err)
	}
	hist, err := store.History(ctx, dl.ID)
	if err != nil || len(hist) != 3 || hist[0].Action != "replay" || hist[2].Action != "discard" || hist[2].Actor != "ops" {
		t.Fatalf("History = %+v, %v; want two replays and a discard by ops", hist, err)
	}
}

// TestRabbitMQDeadLetterRefused: WithDeadLetter's bad input is refused at
// construction.
func TestRabbitMQDeadLetterRefused(t *testing.T) {
	t.Parallel()
	db := openDB(t, 2)
	l := newLoyalty(t, db)
	ob := testenv.Outbox(t, db, l.schema, "loyalty")
	for name, opt := range map[string]rabbitmq.Option{"nil outbox": rabbitmq.WithDeadLetter(nil, "dlx", ""), "no destination": rabbitmq.WithDeadLetter(ob, "", "")} {
		if _, err := rabbitmq.NewConsumer(l.mw, l.orderHandler(), opt); err == nil || !strings.Contains(err.Error(), "WithDeadLetter") {
			t.Errorf("%s: %v, want an error naming WithDeadLetter", name, err)
		}
	}
}
