package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

const day = 24 * time.Hour

// horizonTable is a ClaimTable on l's claim table with clock and opts.
func horizonTable(t testing.TB, l *loyalty, clock *testenv.Clock, opts ...idempotent.TableOption) *idempotent.ClaimTable {
	t.Helper()
	tab, err := idempotent.NewClaimTable(l.db, postgres.New(), append([]idempotent.TableOption{
		idempotent.WithTable(l.schema + ".processed_messages"), idempotent.WithClock(clock.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// horizonMiddleware is another Middleware of l's consumer on l's table.
func horizonMiddleware(t testing.TB, l *loyalty, clock *testenv.Clock, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	mw, err := idempotent.New(l.db, postgres.New(), "loyalty", append([]idempotent.Option{
		idempotent.WithTable(l.schema + ".processed_messages"), idempotent.WithClock(clock.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// TestLongerWindowDoesNotReapplyWhatCleanupForgot is issue 20's first case
// on a plain table: a 7-day cleanup deletes a claim; a process whose window
// is then 30 days (a config change, or another process on the same table)
// must not apply the message's replay again.
func TestLongerWindowDoesNotReapplyWhatCleanupForgot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := fenceFixture(t, idempotent.WithRetention(7*day))
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	at := clock.Now()
	apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply); got != idempotent.Applied || err != nil {
		t.Fatalf("first delivery = (%v, %v)", got, err)
	}
	clock.Add(10 * day)
	short := horizonTable(t, l, clock, idempotent.WithRetention(7*day))
	if n, err := short.Cleanup(ctx, idempotent.DefaultCleanupOptions()); n != 1 || err != nil {
		t.Fatalf("7-day Cleanup = (%d, %v), want the one claim", n, err)
	}
	hs, err := short.Horizons(ctx)
	if err != nil || len(hs) != 1 || hs[0].Consumer != "" || hs[0].ForgottenBefore.Before(at) {
		t.Fatalf("Horizons = (%v, %v), want the table's row past the first delivery", hs, err)
	}

	long := horizonMiddleware(t, l, clock, idempotent.WithRetention(30*day))
	for _, entry := range []struct {
		name string
		run  func() (idempotent.Outcome, error)
	}{
		{"ProcessMessage", func() (idempotent.Outcome, error) {
			return long.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply)
		}},
		{"ProcessMessages", func() (idempotent.Outcome, error) {
			out, err := long.ProcessMessages(ctx, []idempotent.Message{{Key: msg.key(), EventTime: at}}, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				return apply(ctx, tx)
			})
			var bke *idempotent.BatchKeyError
			if err != nil && (!errors.As(err, &bke) || bke.Index != 0) {
				t.Errorf("batch error %v does not name message 0", err)
			}
			if len(out) == 1 {
				return out[0], err
			}
			return 0, err
		}},
		{"ClaimMessage", func() (idempotent.Outcome, error) {
			tx, err := l.db.BeginTx(ctx, nil)
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback() }()
			ok, err := long.ClaimMessage(ctx, tx, idempotent.Message{Key: msg.key(), EventTime: at})
			if ok {
				return idempotent.Applied, err
			}
			return idempotent.Duplicate, err
		}},
	} {
		got, err := entry.run()
		if !errors.Is(err, idempotent.ErrBeyondRetention) || got == idempotent.Applied {
			t.Errorf("%s: 30-day replay of a message the 7-day cleanup forgot = (%v, %v), want ErrBeyondRetention", entry.name, got, err)
		} else if !strings.Contains(err.Error(), "retention horizon") {
			t.Errorf("%s: error does not name the horizon: %v", entry.name, err)
		}
	}
	if b, rows := l.balance(t, 7), l.ledgerRows(t, msg.OrderID); b != 50 || rows != 1 {
		t.Fatalf("balance %d and %d ledger rows after the replays, want 50 and 1", b, rows)
	}
	// Inside both windows nothing is refused.
	fresh := orderCompleted{OrderID: 9913, CustomerID: 8, TotalCents: 5000}
	if got, err := long.ProcessMessage(ctx, idempotent.Message{Key: fresh.key(), EventTime: clock.Now().Add(-day)}, func(ctx context.Context, tx *sql.Tx) error {
		return l.credit(ctx, tx, fresh)
	}); got != idempotent.Applied || err != nil {
		t.Fatalf("a day-old message = (%v, %v), want Applied", got, err)
	}
}

// TestLongerWindowDoesNotRecreateDroppedDays is the partitioned form: a
// 30-day MaintainPartitions after a 7-day one must not create the dropped
// days again, and a replay into one is too old, not a missing partition.
func TestLongerWindowDoesNotRecreateDroppedDays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC()
	l, clock := partitionedLoyalty(t, now, 2)
	long := horizonTable(t, l, clock, idempotent.WithDailyPartitions(2), idempotent.WithRetention(30*day))
	if _, err := long.MaintainPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	mw := horizonMiddleware(t, l, clock, idempotent.WithDailyPartitions(2), idempotent.WithRetention(30*day))
	msg := orderCompleted{OrderID: 77, CustomerID: 3, TotalCents: 5000}
	at := now.Add(-10 * day)
	apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
	if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply); got != idempotent.Applied || err != nil {
		t.Fatalf("first delivery = (%v, %v)", got, err)
	}

	short := horizonTable(t, l, clock, idempotent.WithDailyPartitions(2), idempotent.WithRetention(7*day))
	rep, err := short.MaintainPartitions(ctx)
	if err != nil || len(rep.Dropped) < 20 {
		t.Fatalf("7-day MaintainPartitions dropped %d days (%v), want the 23 or so before its window", len(rep.Dropped), err)
	}
	rep, err = long.MaintainPartitions(ctx)
	if err != nil || len(rep.Created) != 0 {
		t.Fatalf("30-day MaintainPartitions after the 7-day one created %v (%v), want none: the days are forgotten", partNames(rep.Created), err)
	}
	got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply)
	if !errors.Is(err, idempotent.ErrBeyondRetention) || errors.Is(err, idempotent.ErrNoPartition) {
		t.Fatalf("replay into a dropped day = (%v, %v), want ErrBeyondRetention", got, err)
	}
	out, err := mw.ProcessMessages(ctx, []idempotent.Message{{Key: "order-completed:78", EventTime: now}, {Key: msg.key(), EventTime: at}},
		func(context.Context, *sql.Tx, []int) error { return nil })
	var bke *idempotent.BatchKeyError
	if !errors.Is(err, idempotent.ErrBeyondRetention) || !errors.As(err, &bke) || bke.Index != 1 || out != nil {
		t.Fatalf("batch with a message of a dropped day = (%v, %v), want a BatchKeyError at 1 matching ErrBeyondRetention", out, err)
	}
	// On a pool of one connection the aborted batch's horizon is read once
	// the transaction has given its connection back.
	one := openDB(t)
	one.SetMaxOpenConns(1)
	mw1, err := idempotent.New(one, postgres.New(), "loyalty", idempotent.WithTable(l.schema+".processed_messages"),
		idempotent.WithClock(clock.Now), idempotent.WithDailyPartitions(2), idempotent.WithRetention(30*day))
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := mw1.ProcessMessages(tctx, []idempotent.Message{{Key: msg.key(), EventTime: at}}, func(context.Context, *sql.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrBeyondRetention) || tctx.Err() != nil {
		t.Fatalf("batch on a pool of one: %v (context: %v), want ErrBeyondRetention at once", err, tctx.Err())
	}
	if b, rows := l.balance(t, 3), l.ledgerRows(t, msg.OrderID); b != 50 || rows != 1 {
		t.Fatalf("balance %d and %d ledger rows, want 50 and 1", b, rows)
	}

	// A day after the horizon without its partition is still transient.
	gone := now.Add(-2 * day)
	name := fmt.Sprintf("%s.processed_messages_p%s", pq.QuoteIdentifier(l.schema), gone.Format("20060102"))
	if _, err := l.db.Exec("DROP TABLE " + name); err != nil {
		t.Fatal(err)
	}
	if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:79", EventTime: gone}, apply); !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("a missing day after the horizon: %v, want ErrNoPartition", err)
	}
}

// TestCleanupWaitsForClaimsOnOlderSnapshots shows the drain: a claim
// statement that read the horizon before a cleanup raised it (here blocked
// behind an in-flight claim of the same key) holds the cleanup's delete
// back until it ends; with a short DrainTimeout the cleanup gives up with
// ErrOldSnapshots and deletes nothing.
func TestCleanupWaitsForClaimsOnOlderSnapshots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := fenceFixture(t, idempotent.WithRetention(30*day))
	retInsertClaims(t, l.db, l.schema+".processed_messages", "loyalty", "old", 5, clock.Now().Add(-20*day))

	// A holder of key K in flight, and a second claim of K waiting for it.
	holder, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }()
	if ok, err := l.mw.ClaimMessage(ctx, holder, idempotent.Message{Key: "k", EventTime: clock.Now()}); !ok || err != nil {
		t.Fatalf("holder's claim = (%v, %v)", ok, err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k", EventTime: clock.Now()}, func(context.Context, *sql.Tx) error { return nil })
		waiter <- err
	}()
	waitLockWaiters(t, openMonitor(t), l.schema, 1)

	short := horizonTable(t, l, clock, idempotent.WithRetention(7*day))
	opts := idempotent.DefaultCleanupOptions()
	opts.DrainTimeout = 100 * time.Millisecond
	n, err := short.Cleanup(ctx, opts)
	if !errors.Is(err, idempotent.ErrOldSnapshots) || n != 0 {
		t.Fatalf("Cleanup while a claim runs on an older snapshot = (%d, %v), want ErrOldSnapshots and nothing deleted", n, err)
	}
	if c := retCount(t, l.db, l.schema+".processed_messages", "message_key LIKE 'old-%'"); c != 5 {
		t.Fatalf("%d old claims left, want all 5", c)
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the waiting claim: %v", err)
	}
	if n, err := short.Cleanup(ctx, idempotent.DefaultCleanupOptions()); n != 5 || err != nil {
		t.Fatalf("Cleanup after the claim ended = (%d, %v), want 5", n, err)
	}
}

// TestHorizonUnderConcurrentCleanups is the invariant under load: a 30-day
// Middleware replays every message while four 7-day cleanups run at once.
// No effect is applied twice, nothing inside both windows is refused, and
// everything the cleanups forgot is refused as too old.
func TestHorizonUnderConcurrentCleanups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 400
	l, clock := fenceFixture(t, idempotent.WithRetention(30*day))
	now := clock.Now()
	orders := make([]orderCompleted, n)
	ats := make([]time.Time, n)
	for i := range orders {
		orders[i] = orderCompleted{OrderID: int64(i + 1), CustomerID: int64(i%100 + 1), TotalCents: 100}
		ats[i] = now.Add(-time.Duration(i) * 20 * day / n) // from now back to 20 days ago
		o := orders[i]
		if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: o.key(), EventTime: ats[i]}, func(ctx context.Context, tx *sql.Tx) error {
			return l.credit(ctx, tx, o)
		}); got != idempotent.Applied || err != nil {
			t.Fatalf("first delivery of %d = (%v, %v)", i, got, err)
		}
	}
	// As if each had been processed at its event time.
	if _, err := l.db.Exec("UPDATE "+qtable(l.schema+".processed_messages")+" p SET processed_at = $1::timestamptz - (split_part(message_key, ':', 2)::int - 1) * $2::interval",
		now, fmt.Sprintf("%d microseconds", (20*day/n).Microseconds())); err != nil {
		t.Fatal(err)
	}
	short := horizonTable(t, l, clock, idempotent.WithRetention(7*day))
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize, opts.MinBatchSize = 7, 1

	replay := func(round int, errs chan<- error) {
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 4 {
					o := orders[i]
					got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: o.key(), EventTime: ats[i]}, func(ctx context.Context, tx *sql.Tx) error {
						return l.credit(ctx, tx, o)
					})
					inside := ats[i].After(now.Add(-7 * day))
					switch {
					case got == idempotent.Duplicate && err == nil:
					case errors.Is(err, idempotent.ErrBeyondRetention) && !inside:
					default:
						errs <- fmt.Errorf("round %d: replay of message %d (%v old) = (%v, %v)", round, i, now.Sub(ats[i]).Round(time.Hour), got, err)
					}
				}
			}()
		}
		wg.Wait()
	}
	errs := make(chan error, 4*n)
	var deleted sync.Map
	var cleaners sync.WaitGroup
	for c := 0; c < 4; c++ {
		cleaners.Add(1)
		go func() {
			defer cleaners.Done()
			var total int64
			for k := 0; k < 20; k++ {
				d, err := short.Cleanup(ctx, opts)
				total += d
				if err != nil && !errors.Is(err, idempotent.ErrCleanupBusy) {
					errs <- fmt.Errorf("cleaner %d: %v", c, err)
					return
				}
			}
			deleted.Store(c, total)
		}()
	}
	replay(1, errs)
	cleaners.Wait()
	replay(2, errs) // every claim the cleanups could delete is gone by now
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var total int64
	deleted.Range(func(_, v any) bool { total += v.(int64); return true })
	left := retCount(t, l.db, l.schema+".processed_messages", "")
	if total+left != n {
		t.Errorf("cleanups deleted %d and %d claims are left: want %d in all", total, left, n)
	}
	if want := retCount(t, l.db, l.schema+".processed_messages", "processed_at < $1", now.Add(-7*day-idempotent.DefaultClockSkew)); want != 0 {
		t.Errorf("%d claims past the window left after the cleanups", want)
	}
	rows, distinct := l.ledgerTotals(t)
	if rows != n || distinct != n {
		t.Fatalf("%d ledger rows for %d orders, want %d each: an effect was applied twice", rows, distinct, n)
	}
}
