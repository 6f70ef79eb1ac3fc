package cdkpubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
)

// TestDeadLetterWorkflow: a message made poison by a broken handler is
// dead-lettered through the outbox under the kind given to WithDeadLetter,
// listed by a deadletter.Store told that kind, replayed through
// ReplaySender after the fix and applied once, replayed again and a
// Duplicate.
func TestDeadLetterWorkflow(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	ob := l.outbox(t)
	const kind = "loyalty.dead-letter"
	b := newMemBroker(t, time.Minute)
	rec := testenv.NewRecorder()
	var broken atomic.Bool
	broken.Store(true)
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if broken.Load() {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithDeadLetter(ob, kind), cdkpubsub.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 3, CustomerID: 1, Points: 5}
	sendOrder(t, b, o, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	pr := start(c, b, &memProc{})
	defer pr.stop(t)
	rec.Until(t, 10*time.Second, "the message dead-lettered", func() bool { return rec.Count(adapter.EventDeadLettered, o.Key()) == 1 })

	store, err := deadletter.New(l.db, deadletter.WithTable(l.schema+".outbox"), deadletter.WithKinds(kind))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	list, _, err := store.List(ctx, deadletter.Filter{Key: o.Key()})
	if err != nil || len(list) != 1 || list[0].Reason == "" {
		t.Fatalf("List = %+v, %v; want the dead letter", list, err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender(deadletter.ReplayKind(kind), cdkpubsub.ReplaySender(b.topic)), outbox.WithPollInterval(10*time.Millisecond))
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
	broken.Store(false)
	for i, want := range []adapter.EventType{adapter.EventApplied, adapter.EventDuplicate} {
		if _, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{list[0].ID}}, "ops"); err != nil {
			t.Fatal(err)
		}
		rec.Until(t, 10*time.Second, "the replay settled", func() bool {
			return rec.Count(adapter.EventApplied, o.Key())+rec.Count(adapter.EventDuplicate, o.Key()) == i+1
		})
		if rec.Count(want, o.Key()) != 1 {
			t.Fatalf("replay %d: applied %d, duplicates %d; want one %v", i+1, rec.Count(adapter.EventApplied, o.Key()), rec.Count(adapter.EventDuplicate, o.Key()), want)
		}
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}
