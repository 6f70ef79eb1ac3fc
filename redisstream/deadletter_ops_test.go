package redisstream_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/redisstream"
)

// TestDeadLetterWorkflow: an entry made poison by a broken handler is
// dead-lettered through the outbox and listed with its reason and event
// time; replayed through ReplaySender after the fix it is applied once, and
// replayed again it is a Duplicate.
func TestDeadLetterWorkflow(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 4)
	l := newLedger(t, db, "loyalty")
	ctx := context.Background()
	ob := l.outbox(t)
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	dead := deadStream(t, rdb, stream)
	at := time.Date(2026, 11, 30, 23, 59, 59, 999999600, time.UTC)
	o := order{OrderID: 7, CustomerID: 1, Points: 5}
	publish(t, rdb, stream, o, at)
	var broken atomic.Bool
	broken.Store(true)
	credit := l.handler()
	c, err := redisstream.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, d *redisstream.Delivery) error {
		if broken.Load() {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, d)
	}, redisstream.WithBlock(20*time.Millisecond), redisstream.WithDeadLetter(ob, dead))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	defer func() {
		if err := r.stop(t); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })

	store, err := deadletter.New(db, deadletter.WithTable(l.schema+".outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	list, _, err := store.List(ctx, deadletter.Filter{Topic: stream, Reason: "refused"})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v; want one dead letter", list, err)
	}
	if d := list[0]; d.Kind != redisstream.DeadLetterKind || !d.EventTime.Equal(at) || d.Destination != dead {
		t.Fatalf("dead letter %+v", d)
	}

	relay, err := outbox.NewRelay(ob, outbox.WithSender(redisstream.DeadLetterKind, redisstream.DeadLetterSender(rdb)),
		outbox.WithSender(redisstream.ReplayKind, redisstream.ReplaySender(rdb)), outbox.WithPollInterval(10*time.Millisecond))
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
	for i, want := range []struct{ applied, duplicates int64 }{{1, 0}, {1, 1}} {
		if _, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{list[0].ID}}, "ops"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the replay settled", func() bool { s := c.Stats(); return s.Applied+s.Duplicates == int64(i+1) })
		if s := c.Stats(); s.Applied != want.applied || s.Duplicates != want.duplicates {
			t.Fatalf("after replay %d: stats %+v, want %d applied and %d duplicates", i+1, s, want.applied, want.duplicates)
		}
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}
