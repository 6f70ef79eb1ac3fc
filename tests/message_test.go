package tests

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
)

// Integration tests of the Message entry points on Postgres: event times
// with batches (in partitioned mode) and with a caller's BeginFunc.

// orderEvent is an OrderCompleted with its producer-assigned event time.
type orderEvent struct {
	order orderCompleted
	at    time.Time
}

func (e orderEvent) message() (idempotent.Message, error) {
	return idempotent.Message{Key: e.order.key(), EventTime: e.at}, nil
}

// messagesOf returns the Messages of events.
func messagesOf(events []orderEvent) []idempotent.Message {
	msgs := make([]idempotent.Message, len(events))
	for i, e := range events {
		msgs[i], _ = e.message()
	}
	return msgs
}

// creditEvents returns a BatchFunc crediting the fresh events, counting runs.
func (l *loyalty) creditEvents(events []orderEvent, runs *int) idempotent.BatchFunc {
	return func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		*runs++
		for _, i := range fresh {
			if err := l.credit(ctx, tx, events[i].order); err != nil {
				return err
			}
		}
		return nil
	}
}

// A batch in partitioned mode puts each claim in its own event day's
// partition; redelivered on a later day, after partition maintenance, it is
// Duplicate throughout and applies nothing again.
func TestMessageBatchPartitionedRedeliveredLaterIsDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2031, 3, 14, 23, 59, 30, 0, time.UTC)
	l, clock := partitionedLoyalty(t, now, 2)
	events := []orderEvent{
		{orderCompleted{OrderID: 3, CustomerID: 3, TotalCents: 3000}, time.Date(2031, 3, 14, 23, 59, 0, 0, time.UTC)},
		{orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 1000}, time.Date(2031, 3, 12, 8, 0, 0, 0, time.UTC)},
		{orderCompleted{OrderID: 2, CustomerID: 2, TotalCents: 2000}, time.Date(2031, 3, 13, 8, 0, 0, 0, time.UTC)},
	}
	runs := 0
	outs, err := l.mw.ProcessMessages(ctx, messagesOf(events), l.creditEvents(events, &runs))
	if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Applied}) || runs != 1 {
		t.Fatalf("first delivery = (%v, %v) in %d runs, want all applied in 1", outs, err, runs)
	}
	for _, e := range events {
		if got, want := partitionOf(t, l, e.order.key()), l.schema+".processed_messages_p"+e.at.Format("20060102"); got != want {
			t.Fatalf("claim of %s in %s, want %s", e.order.key(), got, want)
		}
	}

	// Two days later the same batch comes again, with one new message.
	clock.Set(now.Add(2 * 24 * time.Hour))
	if _, err := l.mw.ClaimTable().MaintainPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	again := append(slices.Clone(events), orderEvent{orderCompleted{OrderID: 4, CustomerID: 4, TotalCents: 4000}, now.Add(2 * 24 * time.Hour)})
	outs, err = l.mw.ProcessMessages(ctx, messagesOf(again), l.creditEvents(again, &runs))
	want := []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate, idempotent.Applied}
	if err != nil || !slices.Equal(outs, want) || runs != 2 {
		t.Fatalf("redelivery = (%v, %v) after %d runs, want %v after 2", outs, err, runs, want)
	}
	// Only the duplicates: the handler does not run at all.
	outs, err = l.mw.ProcessMessages(ctx, messagesOf(events), l.creditEvents(events, &runs))
	if err != nil || !slices.Equal(outs, want[:3]) || runs != 2 {
		t.Fatalf("redelivery of duplicates only = (%v, %v) after %d runs, want %v after 2", outs, err, runs, want[:3])
	}
	for _, e := range again {
		if b, n := l.balance(t, e.order.CustomerID), l.ledgerRows(t, e.order.OrderID); b != pointsFor(e.order) || n != 1 {
			t.Fatalf("customer %d: balance %d, %d ledger rows; want %d and 1", e.order.CustomerID, b, n, pointsFor(e.order))
		}
	}
}

// A batch with one message beyond the retention window (or dated in the
// future) is refused whole, naming the message, and writes nothing.
func TestMessageBatchOutsideRetentionWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, _ := partitionedLoyalty(t, now, 2)
	ok := orderEvent{orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 1000}, now.Add(-time.Hour)}
	for _, c := range []struct {
		name string
		at   time.Time
		want error
	}{
		{"beyond retention", now.Add(-idempotent.DefaultRetention - time.Hour), idempotent.ErrBeyondRetention},
		{"in the future", now.Add(time.Hour), idempotent.ErrInvalidEventTime},
		{"no event time", time.Time{}, idempotent.ErrInvalidEventTime},
	} {
		events := []orderEvent{ok, {orderCompleted{OrderID: 2, CustomerID: 2, TotalCents: 2000}, c.at}}
		runs := 0
		outs, err := l.mw.ProcessMessages(ctx, messagesOf(events), l.creditEvents(events, &runs))
		var be *idempotent.BatchKeyError
		if outs != nil || !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, c.want) || runs != 0 {
			t.Fatalf("%s: got (%v, %v) after %d runs, want a *BatchKeyError at 1 matching %v", c.name, outs, err, runs, c.want)
		}
	}
	if n := retCount(t, l.db, l.schema+".processed_messages", ""); n != 0 || l.balance(t, 1) != 0 {
		t.Fatalf("%d claims and balance %d after refused batches, want nothing written", n, l.balance(t, 1))
	}
}

// appTx is a library's transaction type wrapping *sql.Tx.
type appTx struct{ *sql.Tx }

// beginApp counts the transactions it begins.
func beginApp(begun *int) idempotent.BeginFunc[appTx] {
	return func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (appTx, *sql.Tx, error) {
		*begun++
		tx, err := db.BeginTx(ctx, opts)
		return appTx{tx}, tx, err
	}
}

// ProcessMessageTx fences by event time: a message older than the window
// is refused before any transaction begins, and nothing is written.
func TestMessageTxBeyondRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := fenceFixture(t, idempotent.WithRetention(7*24*time.Hour))
	now := clock.Now()
	begun := 0
	o := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	credit := func(ctx context.Context, tx appTx) error { return l.credit(ctx, tx.Tx, o) }

	got, err := idempotent.ProcessMessageTx(ctx, l.mw, idempotent.Message{Key: o.key(), EventTime: now.Add(-8 * 24 * time.Hour)}, beginApp(&begun), credit)
	if got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) || begun != 0 {
		t.Fatalf("8-day-old event = (%v, %v), %d transactions begun; want ErrBeyondRetention and none", got, err, begun)
	}
	if n := retCount(t, l.db, l.schema+".processed_messages", ""); n != 0 || l.balance(t, 7) != 0 {
		t.Fatalf("%d claims and balance %d after a fenced message, want nothing written", n, l.balance(t, 7))
	}
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		got, err := idempotent.ProcessMessageTx(ctx, l.mw, idempotent.Message{Key: o.key(), EventTime: now.Add(-time.Hour)}, beginApp(&begun), credit)
		if got != want || err != nil {
			t.Fatalf("delivery %d of an hour-old event = (%v, %v), want %v", i+1, got, err, want)
		}
	}
	if l.balance(t, 7) != pointsFor(o) || begun != 2 {
		t.Fatalf("balance %d after %d transactions, want %d after 2", l.balance(t, 7), begun, pointsFor(o))
	}
}

// WrapMessageTx in partitioned mode: the event time reaches the claim
// through a caller's BeginFunc.
func TestMessageTxPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, _ := partitionedLoyalty(t, now, 2)
	begun := 0
	handle := idempotent.WrapMessageTx(l.mw, orderEvent.message, beginApp(&begun), func(ctx context.Context, tx appTx, e orderEvent) error {
		return l.credit(ctx, tx.Tx, e.order)
	})
	e := orderEvent{orderCompleted{OrderID: 5, CustomerID: 5, TotalCents: 900}, time.Date(2031, 3, 10, 23, 30, 0, 0, time.FixedZone("UTC-2", -2*3600))}
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if got, err := handle(ctx, e); got != want || err != nil {
			t.Fatalf("delivery %d = (%v, %v), want %v", i+1, got, err, want)
		}
	}
	if got, want := partitionOf(t, l, e.order.key()), l.schema+".processed_messages_p20310311"; got != want {
		t.Fatalf("claim in %s, want %s (the event's UTC day)", got, want)
	}
	if l.balance(t, 5) != pointsFor(e.order) {
		t.Fatalf("balance %d, want %d", l.balance(t, 5), pointsFor(e.order))
	}
}
