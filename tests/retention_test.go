package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// retMiddleware returns a Middleware for consumer on table (schema.name),
// with the schema made by EnsureSchema.
func retMiddleware(t testing.TB, db *sql.DB, table, consumer string, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	opts = append([]idempotent.Option{idempotent.WithTable(table)}, opts...)
	mw, err := idempotent.New(db, postgres.New(), consumer, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return mw
}

func qtable(table string) string {
	t, err := dialect.ParseTable(table)
	if err != nil {
		panic(err)
	}
	return t.Quoted(pq.QuoteIdentifier)
}

// retInsertClaims inserts n claims of consumer processed at at, keyed
// prefix-1 … prefix-n.
func retInsertClaims(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, at time.Time) {
	t.Helper()
	_, err := db.Exec("INSERT INTO "+qtable(table)+" (consumer, message_key, processed_at) SELECT $1, $2 || '-' || g, $3 FROM generate_series(1, $4::int) g",
		consumer, prefix, at, n)
	if err != nil {
		t.Fatal(err)
	}
}

// retCount counts the claims of table matching where.
func retCount(t testing.TB, db *sql.DB, table, where string, args ...any) int64 {
	t.Helper()
	var n int64
	q := "SELECT count(*) FROM " + qtable(table)
	if where != "" {
		q += " WHERE " + where
	}
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// openDBWith is openDB with extra connection parameters (key=value, joined
// by &) added to the DSN, which must be a URL.
func openDBWith(t testing.TB, params string) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	sep := "?"
	if strings.Contains(pgDSN, "?") {
		sep = "&"
	}
	db, err := sql.Open("postgres", pgDSN+sep+params)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// plainDialect hides every optional interface of the dialect it wraps, as a
// dialect without cleanup or partition support would.
type plainDialect struct{ dialect.Dialect }

func (plainDialect) Name() string { return "bare" }

func TestRetentionOptionsRejectBadInput(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	long := strings.Repeat("x", 54)
	for _, c := range []struct {
		name string
		opts []idempotent.Option
		want string
	}{
		{"zero retention", []idempotent.Option{idempotent.WithRetention(0)}, "WithRetention: 0s is not a positive duration"},
		{"negative retention", []idempotent.Option{idempotent.WithRetention(-time.Hour)}, "WithRetention: -1h0m0s is not a positive duration"},
		{"negative skew", []idempotent.Option{idempotent.WithClockSkew(-time.Second)}, "WithClockSkew: -1s is negative"},
		{"nil clock", []idempotent.Option{idempotent.WithClock(nil)}, "WithClock: nil clock"},
		{"zero lead days", []idempotent.Option{idempotent.WithDailyPartitions(0)}, "WithDailyPartitions: 0 lead days, want at least 1"},
		{"negative lead days", []idempotent.Option{idempotent.WithDailyPartitions(-2)}, "WithDailyPartitions: -2 lead days"},
		{"table too long for partitions", []idempotent.Option{idempotent.WithTable(long), idempotent.WithDailyPartitions(3)}, "its partitions' names would be 64 bytes, the limit is 63"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mw, err := idempotent.New(db, postgres.New(), "loyalty", c.opts...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New = (%v, %v), want an error containing %q", mw, err, c.want)
			}
		})
	}
	if _, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(long[:53]), idempotent.WithDailyPartitions(1)); err != nil {
		t.Fatalf("53-byte table name: %v", err)
	}
	if _, err := idempotent.New(db, plainDialect{postgres.New()}, "loyalty", idempotent.WithDailyPartitions(3)); err == nil ||
		err.Error() != "idempotent: WithDailyPartitions: the bare dialect does not support partitions" {
		t.Fatalf("partitions on a dialect without them: %v", err)
	}
}

func TestCleanupDeletesOnlyClaimsOlderThanTheWindow(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	now := time.Now().UTC().Truncate(time.Second)
	clock := testenv.NewClock(now)
	const window, skew = 30 * 24 * time.Hour, 5 * time.Minute
	mw := retMiddleware(t, db, table, "loyalty", idempotent.WithClock(clock.Now))
	if mw.Config().Retention != window {
		t.Fatalf("default retention %v, want %v", mw.Config().Retention, window)
	}
	cutoff := now.Add(-window - skew)
	retInsertClaims(t, db, table, "loyalty", "expired", 2500, cutoff.Add(-time.Hour))
	retInsertClaims(t, db, table, "loyalty", "just-expired", 3, cutoff.Add(-time.Microsecond))
	retInsertClaims(t, db, table, "loyalty", "in-margin", 7, cutoff.Add(time.Minute)) // older than the window, younger than window+skew
	retInsertClaims(t, db, table, "loyalty", "at-cutoff", 5, cutoff)                  // exactly at the cutoff: kept
	retInsertClaims(t, db, table, "loyalty", "in-window", 11, now.Add(-window+time.Minute))
	retInsertClaims(t, db, table, "loyalty", "fresh", 13, now)
	retInsertClaims(t, db, table, "analytics", "expired", 100, cutoff.Add(-time.Hour)) // another consumer's
	ctx := context.Background()

	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize = 1000
	opts.DryRun = true
	if n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts); err != nil || n != 2503 {
		t.Fatalf("dry run = (%d, %v), want 2503", n, err)
	}
	if n := retCount(t, db, table, ""); n != 2639 {
		t.Fatalf("dry run deleted something: %d claims left, want 2639", n)
	}

	opts.DryRun = false
	var progress []idempotent.CleanupProgress
	opts.Progress = func(p idempotent.CleanupProgress) { progress = append(progress, p) }
	n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
	if err != nil || n != 2503 {
		t.Fatalf("Cleanup = (%d, %v), want 2503", n, err)
	}
	var got []int64
	for i, p := range progress {
		got = append(got, p.Deleted)
		if p.Batch != i+1 || p.BatchSize != 1000 || p.TimedOut || !p.Cutoff.Equal(cutoff) {
			t.Errorf("progress %d: %+v", i, p)
		}
	}
	if fmt.Sprint(got) != "[1000 1000 503 0]" || progress[len(progress)-1].Total != 2503 {
		t.Fatalf("batches deleted %v (total %d), want [1000 1000 503 0]", got, progress[len(progress)-1].Total)
	}
	for prefix, want := range map[string]int64{"expired": 0, "just-expired": 0, "in-margin": 7, "at-cutoff": 5, "in-window": 11, "fresh": 13} {
		if n := retCount(t, db, table, "consumer = 'loyalty' AND message_key LIKE $1", prefix+"-%"); n != want {
			t.Errorf("%s: %d claims left, want %d", prefix, n, want)
		}
	}
	if n := retCount(t, db, table, "consumer = 'analytics'"); n != 100 {
		t.Fatalf("another consumer's claims were deleted: %d left, want 100", n)
	}

	// An operator's cleanup of every consumer.
	opts.Progress = nil
	if n, err := mw.ClaimTable().Cleanup(ctx, opts); err != nil || n != 100 {
		t.Fatalf("Cleanup of every consumer = (%d, %v), want 100", n, err)
	}
	if n := retCount(t, db, table, ""); n != 36 {
		t.Fatalf("%d claims left, want 36", n)
	}
}

// slowDeletes makes any DELETE of more than 100 rows from table sleep for
// 10 seconds, so batches above 100 run out of a short statement timeout and
// batches of 100 or fewer do not, whatever the machine's speed.
func slowDeletes(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	schema := strings.Split(table, ".")[0]
	fn := pq.QuoteIdentifier(schema) + ".slow_big_delete"
	_, err := db.Exec(fmt.Sprintf(`
CREATE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF (SELECT count(*) FROM old_rows) > 100 THEN PERFORM pg_sleep(10); END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER slow_big_delete AFTER DELETE ON %[2]s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION %[1]s();`,
		fn, qtable(table)))
	if err != nil {
		t.Fatal(err)
	}
}

func TestCleanupHalvesTheBatchWhenItTimesOut(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	mw := retMiddleware(t, db, table, "loyalty")
	retInsertClaims(t, db, table, "loyalty", "old", 300, time.Now().AddDate(0, -2, 0))
	slowDeletes(t, db, table)
	ctx := context.Background()

	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize, opts.MinBatchSize, opts.StatementTimeout = 1000, 10, 200*time.Millisecond
	var sizes []string
	guard, stop := context.WithCancel(ctx) // a cleanup that never shrinks would loop
	defer stop()
	opts.Progress = func(p idempotent.CleanupProgress) {
		sizes = append(sizes, fmt.Sprintf("%d:%d:%v", p.BatchSize, p.Deleted, p.TimedOut))
		if p.Batch >= 20 {
			stop()
		}
	}
	n, err := mw.ClaimTable().CleanupConsumer(guard, mw.Config().Consumer, opts)
	if err != nil || n != 300 {
		t.Fatalf("Cleanup = (%d, %v), want 300", n, err)
	}
	want := "[1000:0:true 500:0:true 250:0:true 125:0:true 62:62:false 62:62:false 62:62:false 62:62:false 62:52:false 62:0:false]"
	if fmt.Sprint(sizes) != want {
		t.Fatalf("batches %v\nwant    %v", sizes, want)
	}

	// At the floor a timeout is an error, and nothing was deleted.
	retInsertClaims(t, db, table, "loyalty", "again", 300, time.Now().AddDate(0, -2, 0))
	opts.MinBatchSize, opts.Progress = 200, nil
	n, err = mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
	var pqErr *pq.Error
	if n != 0 || !errors.As(err, &pqErr) || pqErr.Code != "57014" || !strings.Contains(err.Error(), "a batch of 200 claims (the floor) ran longer than 200ms") {
		t.Fatalf("Cleanup at the floor = (%d, %v), want 0 and a 57014 error naming the floor", n, err)
	}
	if left := retCount(t, db, table, ""); left != 300 {
		t.Fatalf("%d claims left after the failed cleanup, want 300", left)
	}
}

func TestCleanupSecondRunnerReturnsAtOnce(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	mw := retMiddleware(t, db, table, "loyalty")
	retInsertClaims(t, db, table, "loyalty", "old", 5000, time.Now().AddDate(0, -2, 0))
	ctx := context.Background()
	tab, _ := dialect.ParseTable(table)

	// Another runner is in a batch: it holds the table's cleanup lock.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var got bool
	if err := tx.QueryRowContext(ctx, cleanupLock(tab)).Scan(&got); err != nil || !got {
		t.Fatalf("take the cleanup lock: %v, %v", got, err)
	}
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize = 100
	n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
	if n != 0 || !errors.Is(err, idempotent.ErrCleanupBusy) {
		t.Fatalf("Cleanup while another holds the lock = (%d, %v), want 0 and ErrCleanupBusy", n, err)
	}
	// Another spelling of the same table ("claims" on the schema's search
	// path) takes the same lock.
	db2 := openDBWith(t, "search_path="+tab.Schema)
	other := retMiddleware(t, db2, "claims", "loyalty")
	if n, err := other.ClaimTable().CleanupConsumer(ctx, other.Config().Consumer, opts); n != 0 || !errors.Is(err, idempotent.ErrCleanupBusy) {
		t.Fatalf("Cleanup of another spelling of the table = (%d, %v), want 0 and ErrCleanupBusy", n, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if left := retCount(t, db, table, ""); left != 5000 {
		t.Fatalf("a busy cleanup deleted claims: %d left, want 5000", left)
	}

	// Two runners at once: between them every claim goes exactly once, and
	// one that finds the other in a batch stops with ErrCleanupBusy.
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
			total.Add(n)
			errs[i] = err
		}()
	}
	wg.Wait()
	finished := 0
	for _, err := range errs {
		switch {
		case err == nil:
			finished++
		case !errors.Is(err, idempotent.ErrCleanupBusy):
			t.Fatalf("concurrent cleanup: %v", err)
		}
	}
	// The runners that stopped busy left the rest to the others; run once
	// more in case the last holder stopped busy too.
	rest, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
	if err != nil {
		t.Fatal(err)
	}
	if total.Load()+rest != 5000 || retCount(t, db, table, "") != 0 {
		t.Fatalf("deleted %d + %d, want 5000 in all, and nothing left", total.Load(), rest)
	}
	t.Logf("%d of 4 concurrent runners finished, the others found the table busy", finished)
}

func TestCleanupStopsBetweenBatchesWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	mw := retMiddleware(t, db, table, "loyalty")
	retInsertClaims(t, db, table, "loyalty", "old", 1000, time.Now().AddDate(0, -2, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize = 100
	calls := 0
	opts.Progress = func(idempotent.CleanupProgress) {
		calls++
		cancel()
	}
	n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
	if n != 100 || !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("Cleanup = (%d, %v) after %d batches, want 100 and context.Canceled after 1", n, err, calls)
	}
	if left := retCount(t, db, table, ""); left != 900 {
		t.Fatalf("%d claims left, want 900", left)
	}
}

func TestCleanupRejectsBadInput(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	table := schema + ".claims"
	mw := retMiddleware(t, db, table, "loyalty")
	retInsertClaims(t, db, table, "loyalty", "old", 10, time.Now().AddDate(0, -2, 0))
	ctx := context.Background()
	mod := func(f func(*idempotent.CleanupOptions)) idempotent.CleanupOptions {
		o := idempotent.DefaultCleanupOptions()
		f(&o)
		return o
	}
	for _, c := range []struct {
		name string
		opts idempotent.CleanupOptions
		want string
	}{
		{"zero options", idempotent.CleanupOptions{}, "BatchSize is 0, want at least 1 (start from DefaultCleanupOptions)"},
		{"negative batch", mod(func(o *idempotent.CleanupOptions) { o.BatchSize = -5 }), "BatchSize is -5"},
		{"zero floor", mod(func(o *idempotent.CleanupOptions) { o.MinBatchSize = 0 }), "MinBatchSize is 0"},
		{"floor above batch", mod(func(o *idempotent.CleanupOptions) { o.MinBatchSize = 20_000 }), "MinBatchSize 20000 is larger than BatchSize 10000"},
		{"zero timeout", mod(func(o *idempotent.CleanupOptions) { o.StatementTimeout = 0 }), "StatementTimeout is 0s"},
		{"negative pause", mod(func(o *idempotent.CleanupOptions) { o.Pause = -time.Second }), "Pause is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, c.opts)
			if n != 0 || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Cleanup = (%d, %v), want an error containing %q", n, err, c.want)
			}
		})
	}
	if left := retCount(t, db, table, ""); left != 10 {
		t.Fatalf("bad options deleted claims: %d left", left)
	}

	missing, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".nope"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{false, true} {
		opts := idempotent.DefaultCleanupOptions()
		opts.DryRun = dry
		n, err := missing.ClaimTable().CleanupConsumer(ctx, missing.Config().Consumer, opts)
		if n != 0 || !errors.Is(err, idempotent.ErrNoClaimTable) || !strings.Contains(err.Error(), schema+".nope") {
			t.Fatalf("dry=%v: Cleanup of a missing table = (%d, %v), want ErrNoClaimTable naming it", dry, n, err)
		}
	}

	bare, err := idempotent.New(db, plainDialect{postgres.New()}, "loyalty", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.ClaimTable().CleanupConsumer(ctx, bare.Config().Consumer, idempotent.DefaultCleanupOptions()); err == nil ||
		err.Error() != "idempotent: CleanupConsumer: the bare dialect does not support batched cleanup" {
		t.Fatalf("Cleanup on a dialect without it: %v", err)
	}
}

// fenceFixture is the loyalty service with a controllable clock.
func fenceFixture(t *testing.T, opts ...idempotent.Option) (*loyalty, *testenv.Clock) {
	t.Helper()
	db := openDB(t)
	clock := testenv.NewClock(time.Now())
	l := newLoyalty(t, db, append([]idempotent.Option{idempotent.WithClock(clock.Now)}, opts...)...)
	return l, clock
}

func TestRetentionFenceRefusesMessagesOlderThanTheWindow(t *testing.T) {
	t.Parallel()
	l, clock := fenceFixture(t, idempotent.WithRetention(7*24*time.Hour))
	ctx := context.Background()
	now := clock.Now()
	ran := 0
	credit := func(o orderCompleted) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error { ran++; return l.credit(ctx, tx, o) }
	}

	old := orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 5000}
	got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: old.key(), EventTime: now.Add(-7*24*time.Hour - time.Second)}, credit(old))
	if got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) || ran != 0 {
		t.Fatalf("8-day-old event = (%v, %v), handler ran %d times; want ErrBeyondRetention and no run", got, err, ran)
	}
	if !strings.Contains(err.Error(), `key "order-completed:1"`) || !strings.Contains(err.Error(), "older than the retention window of 168h0m0s") {
		t.Errorf("error does not explain itself: %v", err)
	}
	if n := retCount(t, l.db, l.schema+".processed_messages", ""); n != 0 {
		t.Fatalf("a fenced message left %d claims", n)
	}

	young := orderCompleted{OrderID: 2, CustomerID: 2, TotalCents: 5000}
	at := now.Add(-7*24*time.Hour + time.Minute)
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: young.key(), EventTime: at}, credit(young)); got != want || err != nil {
			t.Fatalf("delivery %d of a 7-day-old event = (%v, %v), want %v", i+1, got, err, want)
		}
	}
	if l.balance(t, 2) != 50 || ran != 1 {
		t.Fatalf("balance %d after %d runs, want 50 after 1", l.balance(t, 2), ran)
	}

	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: young.key(), EventTime: now.Add(24 * time.Hour)}, credit(young)); got != 0 || !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("an event time a day ahead = (%v, %v), want ErrInvalidEventTime", got, err)
	}

	// WrapMessage takes the time from the message.
	type event struct {
		order orderCompleted
		at    time.Time
	}
	h := idempotent.WrapMessage(l.mw, func(e event) (idempotent.Message, error) {
		return idempotent.Message{Key: e.order.key(), EventTime: e.at}, nil
	},
		func(ctx context.Context, tx *sql.Tx, e event) error { ran++; return l.credit(ctx, tx, e.order) })
	third := orderCompleted{OrderID: 3, CustomerID: 3, TotalCents: 7000}
	if got, err := h(ctx, event{third, now.Add(-8 * 24 * time.Hour)}); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("WrapMessage old = (%v, %v)", got, err)
	}
	if got, err := h(ctx, event{third, now}); got != idempotent.Applied || err != nil {
		t.Fatalf("WrapMessage fresh = (%v, %v)", got, err)
	}
	failing := idempotent.WrapMessage(l.mw, func(event) (idempotent.Message, error) { return idempotent.Message{}, errors.New("no id") },
		func(context.Context, *sql.Tx, event) error { ran++; return nil })
	if _, err := failing(ctx, event{}); !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Fatalf("failing key function: %v", err)
	}

	// ClaimMessage in a transaction the caller owns.
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "order-completed:4", EventTime: now.Add(-8 * 24 * time.Hour)}); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("ClaimMessage old: %v", err)
	}
	if ok, err := l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "order-completed:4", EventTime: now}); !ok || err != nil {
		t.Fatalf("ClaimMessage fresh = (%v, %v)", ok, err)
	}
	if ran != 2 {
		t.Fatalf("handlers ran %d times, want 2", ran)
	}
}

// TestFenceStopsAReplayAfterCleanup is the reason for the fence: a replay
// that arrives after its claim was cleaned up would be applied again; with
// its event time it is refused.
func TestFenceStopsAReplayAfterCleanup(t *testing.T) {
	t.Parallel()
	l, clock := fenceFixture(t)
	ctx := context.Background()
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	eventTime := clock.Now()
	apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: eventTime}, apply); got != idempotent.Applied || err != nil {
		t.Fatalf("first delivery = (%v, %v)", got, err)
	}

	// 31 days later the claim is past the window and the margin.
	clock.Add(idempotent.DefaultRetention + idempotent.DefaultClockSkew + 24*time.Hour)
	if n, err := l.mw.ClaimTable().CleanupConsumer(ctx, l.mw.Config().Consumer, idempotent.DefaultCleanupOptions()); n != 1 || err != nil {
		t.Fatalf("Cleanup = (%d, %v), want the one claim", n, err)
	}
	got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: eventTime}, apply)
	if !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("replay with its event time = (%v, %v), want ErrBeyondRetention", got, err)
	}
	if b := l.balance(t, 7); b != 50 {
		t.Fatalf("balance %d after the fenced replay, want 50", b)
	}
	// Without an event time nothing is fenced: the replay applies again.
	// This is why messages should carry their event time.
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, apply); got != idempotent.Applied || err != nil {
		t.Fatalf("replay without event time = (%v, %v)", got, err)
	}
	if b := l.balance(t, 7); b != 100 {
		t.Fatalf("balance %d, want 100: the unfenced replay applied again", b)
	}
}

// TestFenceObserverSeesRefusals checks that a fenced message is reported to
// the observer as a failure.
func TestFenceObserverSeesRefusals(t *testing.T) {
	t.Parallel()
	var counts idempotent.Counts
	l, clock := fenceFixture(t, idempotent.WithObserver(&counts))
	ctx := context.Background()
	nop := func(context.Context, *sql.Tx) error { return nil }
	_, _ = l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k1", EventTime: clock.Now().AddDate(0, -2, 0)}, nop)
	_, _ = l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k2", EventTime: clock.Now().Add(24 * time.Hour)}, nop)
	_, _ = l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k3", EventTime: clock.Now()}, nop)
	if counts.Failed() != 2 || counts.Applied() != 1 {
		t.Fatalf("observer counted %d failed, %d applied; want 2 and 1", counts.Failed(), counts.Applied())
	}
}

// cleanupLock is the Postgres dialect's cleanup lock query, which takes no
// arguments.
func cleanupLock(t dialect.Table) string {
	q, _ := postgres.New().CleanupLockSQL(t)
	return q
}
