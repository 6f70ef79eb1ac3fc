package dialecttest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// The retention checks run the statements of dialect.Cleaner,
// dialect.StatsReader and dialect.HorizonKeeper directly, in the order the
// middleware runs them, so that they pin what the dialect promises whatever
// the middleware builds on it.

// retentionCutoff is the cutoff the cleanup checks use: a whole millisecond,
// so that claims a millisecond either side of it exist in every dialect's
// precision.
var retentionCutoff = time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)

// implements returns the dialect under test as T, or skips t: the dialect
// does not implement the interface named name.
func implements[T any](t *testing.T, e *Env, name string) T {
	t.Helper()
	v, ok := e.h.Dialect.(T)
	if !ok {
		t.Skipf("the %s dialect does not implement dialect.%s", e.h.Dialect.Name(), name)
	}
	return v
}

// retentionTable names a fresh claim table, creates it (EnsureSchema) and
// its horizon table, and returns the open database, the name and the
// parsed table.
func retentionTable(t *testing.T, e *Env) (*sql.DB, string, dialect.Table) {
	t.Helper()
	if e.h.ProcessedAt == nil {
		t.Fatalf("Harness.ProcessedAt is nil: the %s dialect implements a retention interface, whose checks insert claims with it", e.h.Dialect.Name())
	}
	db := e.DB(t)
	name := e.Table(t, db)
	e.Middleware(t, db, name, "conformance")
	tab, err := dialect.ParseTable(name)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := e.h.Dialect.(dialect.HorizonKeeper); ok {
		for range 2 { // creating it again is harmless
			for _, s := range h.HorizonSchemaSQL(tab) {
				if _, err := db.Exec(s); err != nil {
					t.Fatalf("HorizonSchemaSQL: %v\n%s", err, s)
				}
			}
		}
	}
	return db, name, tab
}

// seedClaims inserts n claims of consumer, keyed prefix-1 … prefix-n and
// processed at at (as Harness.ProcessedAt writes it).
func seedClaims(t testing.TB, e *Env, db *sql.DB, table, consumer, prefix string, n int, at time.Time) {
	t.Helper()
	at = at.UTC()
	const rows = 200
	for i := 0; i < n; i += rows {
		var b strings.Builder
		b.WriteString("INSERT INTO " + table + " (consumer, message_key, processed_at) VALUES ")
		for j := i; j < min(n, i+rows); j++ {
			if j > i {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "('%s', '%s-%d', %s)", consumer, prefix, j+1, e.h.ProcessedAt(at))
		}
		if _, err := db.Exec(b.String()); err != nil {
			t.Fatalf("seed claims: %v", err)
		}
	}
}

// countClaims counts consumer's claims keyed prefix-….
func countClaims(t testing.TB, db *sql.DB, table, consumer, prefix string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf("SELECT count(*) FROM %s WHERE consumer = '%s' AND message_key LIKE '%s-%%'", table, consumer, prefix)
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("count claims: %v", err)
	}
	return n
}

// cleanupBatch runs one batch of a cleanup as the middleware does, in its
// own transaction: the lock (and, when another holds it, nothing else), the
// statement timeout, the horizon, the delete, and — on every path, before
// the transaction ends — the dialect's release. It returns the rows
// deleted and whether the lock was taken.
func cleanupBatch(ctx context.Context, db *sql.DB, c dialect.Cleaner, tab dialect.Table, consumer string, cutoff time.Time, limit int) (n int64, locked bool, err error) {
	n, locked, err = cleanupBatchTx(ctx, db, c, tab, consumer, cutoff, limit)
	if w, ok := c.(dialect.CleanupLockWaiter); ok && err != nil && w.IsCleanupLockBusy(err) {
		// The lock is one a batch waits for (SQLite's write lock), and it
		// stayed taken past the wait: as ClaimTable.Cleanup does
		// (ErrCleanupBusy), the batch did not take it.
		return 0, false, nil
	}
	return n, locked, err
}

// cleanupBatchTx is cleanupBatch before a busy lock is told apart.
func cleanupBatchTx(ctx context.Context, db *sql.DB, c dialect.Cleaner, tab dialect.Table, consumer string, cutoff time.Time, limit int) (n int64, locked bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = tx.Rollback() }()
	q, args := c.CleanupLockSQL(tab)
	if err := tx.QueryRowContext(ctx, q, args...).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("CleanupLockSQL: %w", err)
	}
	if !locked {
		return 0, false, nil
	}
	n, err = func() (int64, error) {
		if s := c.StatementTimeoutSQL(5 * time.Second); s != "" {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return 0, fmt.Errorf("StatementTimeoutSQL: %w", err)
			}
		}
		s, args := c.AdvanceHorizonSQL(tab, consumer, cutoff)
		if _, err := tx.ExecContext(ctx, s, args...); err != nil {
			return 0, fmt.Errorf("AdvanceHorizonSQL: %w", err)
		}
		s, args = c.CleanupBatchSQL(tab, consumer, cutoff, limit)
		res, err := tx.ExecContext(ctx, s, args...)
		if err != nil {
			return 0, fmt.Errorf("CleanupBatchSQL: %w", err)
		}
		return res.RowsAffected()
	}()
	if rerr := releaseCleanup(ctx, tx, c, tab); err == nil {
		err = rerr
	}
	if err != nil {
		return 0, true, err
	}
	return n, true, tx.Commit()
}

// releaseCleanup runs the dialect's ReleaseCleanupSQL, if it has one, even
// when ctx has ended.
func releaseCleanup(ctx context.Context, tx *sql.Tx, c dialect.Cleaner, tab dialect.Table) error {
	r, ok := c.(dialect.LockReleaser)
	if !ok {
		return nil
	}
	s, args := r.ReleaseCleanupSQL(tab)
	if s == "" {
		return nil
	}
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), s, args...); err != nil {
		return fmt.Errorf("ReleaseCleanupSQL: %w", err)
	}
	return nil
}

// cleanupAll runs batches until one deletes nothing and returns each
// batch's count; it fails t if a batch does not get the lock.
func cleanupAll(t *testing.T, ctx context.Context, db *sql.DB, c dialect.Cleaner, tab dialect.Table, consumer string, cutoff time.Time, limit int) []int64 {
	t.Helper()
	var got []int64
	for len(got) < 1000 {
		n, locked, err := cleanupBatch(ctx, db, c, tab, consumer, cutoff, limit)
		switch {
		case err != nil:
			t.Fatalf("batch %d: %v", len(got)+1, err)
		case !locked:
			t.Fatalf("batch %d: the cleanup lock is held, with no other cleanup running", len(got)+1)
		}
		got = append(got, n)
		if n == 0 {
			return got
		}
	}
	t.Fatalf("cleanup does not end: %d batches", len(got))
	return nil
}

func countExpired(t *testing.T, ctx context.Context, db *sql.DB, c dialect.Cleaner, tab dialect.Table, consumer string, cutoff time.Time) int64 {
	t.Helper()
	var n int64
	q, args := c.CountExpiredSQL(tab, consumer, cutoff)
	if err := db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("CountExpiredSQL: %v", err)
	}
	return n
}

// horizonRow is one row of HorizonsSQL.
type horizonRow struct {
	consumer string
	micros   int64
}

func (r horizonRow) String() string {
	return fmt.Sprintf("%q@%s", r.consumer, time.UnixMicro(r.micros).UTC().Format("2006-01-02T15:04:05.000000"))
}

func horizons(t testing.TB, db *sql.DB, h dialect.HorizonKeeper, tab dialect.Table) string {
	t.Helper()
	rows, err := db.Query(h.HorizonsSQL(tab))
	if err != nil {
		t.Fatalf("HorizonsSQL: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r horizonRow
		if err := rows.Scan(&r.consumer, &r.micros); err != nil {
			t.Fatalf("HorizonsSQL: %v", err)
		}
		out = append(out, r.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("HorizonsSQL: %v", err)
	}
	return strings.Join(out, " ")
}

func horizonRows(rows ...horizonRow) string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.String()
	}
	return strings.Join(out, " ")
}

// checkCleanerExact: the batches delete exactly the claims processed before
// the cutoff, of one consumer or of all, at most limit at a time, and each
// cleanup records its cutoff as the horizon of what it cleaned.
func checkCleanerExact(t *testing.T, e *Env) {
	c := implements[dialect.Cleaner](t, e, "Cleaner")
	ctx := testContext(t)
	db, table, tab := retentionTable(t, e)
	cutoff := retentionCutoff
	seedClaims(t, e, db, table, "c1", "expired", 250, cutoff.Add(-time.Hour))
	seedClaims(t, e, db, table, "c1", "before", 3, cutoff.Add(-time.Millisecond))
	seedClaims(t, e, db, table, "c1", "at", 5, cutoff) // not before the cutoff: kept
	seedClaims(t, e, db, table, "c1", "after", 7, cutoff.Add(time.Millisecond))
	seedClaims(t, e, db, table, "c1", "fresh", 11, cutoff.Add(24*time.Hour))
	seedClaims(t, e, db, table, "c2", "expired", 40, cutoff.Add(-time.Hour))

	if n := countExpired(t, ctx, db, c, tab, "c1", cutoff); n != 253 {
		t.Errorf("CountExpiredSQL(c1) = %d, want 253", n)
	}
	if n := countExpired(t, ctx, db, c, tab, "", cutoff); n != 293 {
		t.Errorf("CountExpiredSQL(all) = %d, want 293", n)
	}
	if got := cleanupAll(t, ctx, db, c, tab, "c1", cutoff, 100); fmt.Sprint(got) != "[100 100 53 0]" {
		t.Errorf("batches of 100 of consumer c1 deleted %v, want [100 100 53 0]", got)
	}
	for prefix, want := range map[string]int{"expired": 0, "before": 0, "at": 5, "after": 7, "fresh": 11} {
		if n := countClaims(t, db, table, "c1", prefix); n != want {
			t.Errorf("c1 %s: %d claims left, want %d", prefix, n, want)
		}
	}
	if n := countClaims(t, db, table, "c2", "expired"); n != 40 {
		t.Errorf("a cleanup of c1 deleted claims of c2: %d left, want 40", n)
	}

	// Every consumer, with a cutoff between milliseconds: half a
	// millisecond after the "at" claims, which are now before it.
	later := cutoff.Add(500 * time.Microsecond)
	if n := countExpired(t, ctx, db, c, tab, "", later); n != 45 {
		t.Errorf("CountExpiredSQL(all, +0.5ms) = %d, want 45", n)
	}
	if got := cleanupAll(t, ctx, db, c, tab, "", later, 1000); fmt.Sprint(got) != "[45 0]" {
		t.Errorf("a cleanup of every consumer deleted %v, want [45 0]", got)
	}
	for key, want := range map[[2]string]int{{"c1", "at"}: 0, {"c1", "after"}: 7, {"c1", "fresh"}: 11, {"c2", "expired"}: 0} {
		if n := countClaims(t, db, table, key[0], key[1]); n != want {
			t.Errorf("%s %s: %d claims left, want %d", key[0], key[1], n, want)
		}
	}
	want := horizonRows(horizonRow{"", later.UnixMicro()}, horizonRow{"c1", cutoff.UnixMicro()})
	if got := horizons(t, db, c, tab); got != want {
		t.Errorf("horizons after the cleanups: %s, want %s", got, want)
	}
}

// checkCleanerConcurrent: four runners clean one table at once. Between
// them (and a last sweep, in case every runner stopped on a held lock)
// every expired claim goes exactly once and nothing else does. A runner
// that finds the lock held stops at once; where writers are serial
// (SQLite) the lock is the write lock, which a runner waits for up to the
// busy timeout, and stops when it outwaits it.
func checkCleanerConcurrent(t *testing.T, e *Env) {
	c := implements[dialect.Cleaner](t, e, "Cleaner")
	ctx := testContext(t)
	db, table, tab := retentionTable(t, e)
	const expired = 5000
	seedClaims(t, e, db, table, "c1", "expired", expired, retentionCutoff.Add(-time.Hour))
	seedClaims(t, e, db, table, "c1", "fresh", 10, retentionCutoff.Add(time.Hour))

	const runners = 4
	deleted, busy, batches := make([]int64, runners), make([]bool, runners), make([]int, runners)
	errs := make([]error, runners)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range runners {
		pool := e.DB(t) // a process of its own
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				n, locked, err := cleanupBatch(ctx, pool, c, tab, "", retentionCutoff, 100)
				if err != nil {
					errs[i] = err
					return
				}
				if !locked {
					busy[i] = true
					return
				}
				batches[i]++
				deleted[i] += n
				if n == 0 {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	var total int64
	nbusy := 0
	for i := range runners {
		if errs[i] != nil {
			t.Fatalf("runner %d: %v", i, errs[i])
		}
		total += deleted[i]
		if busy[i] {
			nbusy++
		}
	}
	rest := cleanupAll(t, ctx, db, c, tab, "", retentionCutoff, 100)
	var swept int64
	for _, n := range rest {
		swept += n
	}
	if total+swept != expired {
		t.Errorf("the runners deleted %v (%d) and the sweep %d: want %d in all", deleted, total, swept, expired)
	}
	if n := countClaims(t, db, table, "c1", "expired"); n != 0 {
		t.Errorf("%d expired claims left", n)
	}
	if n := countClaims(t, db, table, "c1", "fresh"); n != 10 {
		t.Errorf("%d fresh claims left, want 10", n)
	}
	// Where writers are serial the write lock queues the runners, up to
	// the busy timeout: on a loaded machine a runner may outwait it, and
	// then stops as ClaimTable.Cleanup does (ErrCleanupBusy), which the
	// sweep and the counts above cover.
	t.Logf("runners deleted %v in %v batches; %d stopped on a held lock; the sweep deleted %d", deleted, batches, nbusy, swept)
}

// checkCleanerLockNoWait: while one transaction holds the cleanup lock,
// another's lock query answers false at once (it does not wait for the
// holder), and once the holder has released it (LockReleaser) and ended,
// on commit or on rollback, the lock is free again.
func checkCleanerLockNoWait(t *testing.T, e *Env) {
	c := implements[dialect.Cleaner](t, e, "Cleaner")
	if e.h.SerialWriters {
		t.Skip("SerialWriters: the cleanup lock is the write lock, which a second writer waits for at BEGIN (Optional/Cleaner/Concurrent checks that runners queue and finish)")
	}
	ctx := testContext(t)
	db, _, tab := retentionTable(t, e)
	lock := func(tx *sql.Tx) bool {
		t.Helper()
		var got bool
		q, args := c.CleanupLockSQL(tab)
		if err := tx.QueryRowContext(ctx, q, args...).Scan(&got); err != nil {
			t.Fatalf("CleanupLockSQL: %v", err)
		}
		return got
	}
	// Another pool, as another process has: the holder's session, back in
	// db's pool, may still hold a session-scoped lock it did not release.
	elsewhere := e.DB(t)
	begin := func(db *sql.DB) *sql.Tx {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}
	for _, end := range []string{"commit", "rollback"} {
		holder := begin(db)
		if !lock(holder) {
			t.Fatalf("%s: the first transaction did not get the lock", end)
		}
		other := begin(db)
		if lock(other) {
			t.Fatalf("%s: a second transaction got the lock while the first holds it", end)
		}
		if err := releaseCleanup(ctx, other, c, tab); err != nil {
			t.Fatalf("%s: a release by a transaction that did not get the lock: %v", end, err)
		}
		if err := other.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := releaseCleanup(ctx, holder, c, tab); err != nil {
			t.Fatal(err)
		}
		var err error
		if end == "commit" {
			err = holder.Commit()
		} else {
			err = holder.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		next := begin(elsewhere)
		if !lock(next) {
			t.Fatalf("after the holder released the lock and ended (%s), the lock is still held", end)
		}
		if err := releaseCleanup(ctx, next, c, tab); err != nil {
			t.Fatal(err)
		}
		if err := next.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkStatsReader: StatsSQL yields one row per consumer with claims, ordered
// by consumer: the count, and the oldest and newest processed_at as
// microseconds since the Unix epoch.
func checkStatsReader(t *testing.T, e *Env) {
	s := implements[dialect.StatsReader](t, e, "StatsReader")
	db, table, tab := retentionTable(t, e)
	stats := func() string {
		t.Helper()
		rows, err := db.Query(s.StatsSQL(tab))
		if err != nil {
			t.Fatalf("StatsSQL: %v", err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var consumer string
			var n, oldest, newest int64
			if err := rows.Scan(&consumer, &n, &oldest, &newest); err != nil {
				t.Fatalf("StatsSQL (want consumer, count and two integers of microseconds): %v", err)
			}
			out = append(out, fmt.Sprintf("%s:%d:%d:%d", consumer, n, oldest, newest))
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("StatsSQL: %v", err)
		}
		return strings.Join(out, " ")
	}
	if got := stats(); got != "" {
		t.Errorf("stats of an empty table: %s, want no rows", got)
	}
	t1 := time.Date(2031, 2, 1, 12, 0, 0, 123_000_000, time.UTC)
	t2, t3, t4 := t1.Add(time.Second), t1.Add(48*time.Hour+time.Millisecond), t1.Add(-time.Hour)
	seedClaims(t, e, db, table, "c2", "a", 1, t4)
	seedClaims(t, e, db, table, "c1", "b", 1, t3)
	seedClaims(t, e, db, table, "c1", "c", 1, t1)
	seedClaims(t, e, db, table, "c1", "d", 2, t2)
	want := fmt.Sprintf("c1:4:%d:%d c2:1:%d:%d", t1.UnixMicro(), t3.UnixMicro(), t4.UnixMicro(), t4.UnixMicro())
	if got := stats(); got != want {
		t.Errorf("stats %s, want %s", got, want)
	}
}

// checkHorizonKeeper: the horizon table is created (again harmlessly);
// AdvanceHorizonSQL inserts a row and only ever raises it; HorizonSQL
// yields the later of the consumer's row and the "" row, NULL when neither
// exists; HorizonsSQL lists every row by consumer.
func checkHorizonKeeper(t *testing.T, e *Env) {
	h := implements[dialect.HorizonKeeper](t, e, "HorizonKeeper")
	ctx := testContext(t)
	db, _, tab := retentionTable(t, e)
	if ht := h.HorizonTable(tab); ht.Schema != tab.Schema || !strings.HasSuffix(ht.Name, "_horizon") {
		t.Errorf("HorizonTable(%s) = %s, want a table named …_horizon in the same schema", tab, ht)
	}
	advance := func(consumer string, before time.Time) {
		t.Helper()
		s, args := h.AdvanceHorizonSQL(tab, consumer, before)
		if _, err := db.ExecContext(ctx, s, args...); err != nil {
			t.Fatalf("AdvanceHorizonSQL(%q): %v", consumer, err)
		}
	}
	read := func(consumer string) string {
		t.Helper()
		var v sql.NullInt64
		q, args := h.HorizonSQL(tab, consumer)
		if err := db.QueryRowContext(ctx, q, args...).Scan(&v); err != nil {
			t.Fatalf("HorizonSQL(%q): %v", consumer, err)
		}
		if !v.Valid {
			return "NULL"
		}
		return time.UnixMicro(v.Int64).UTC().Format("2006-01-02T15:04:05.000000")
	}
	at := func(tm time.Time) string { return tm.UTC().Format("2006-01-02T15:04:05.000000") }
	base := time.Date(2031, 2, 1, 12, 0, 0, 123_456_000, time.UTC)
	if got := read("c1"); got != "NULL" {
		t.Errorf("HorizonSQL with no rows = %s, want NULL", got)
	}
	advance("c1", base)
	if got := read("c1"); got != at(base) {
		t.Errorf("after advancing c1: %s, want %s", got, at(base))
	}
	if got := read("c2"); got != "NULL" {
		t.Errorf("another consumer's row fences c2: %s, want NULL", got)
	}
	advance("c1", base.Add(-time.Hour))
	if got := read("c1"); got != at(base) {
		t.Errorf("an earlier advance lowered c1's horizon: %s, want %s", got, at(base))
	}
	advance("", base.Add(time.Hour))
	for _, c := range []string{"c1", "c2"} {
		if got := read(c); got != at(base.Add(time.Hour)) {
			t.Errorf("after advancing every consumer's row: %s reads %s, want %s", c, got, at(base.Add(time.Hour)))
		}
	}
	advance("c2", base.Add(2*time.Hour))
	advance("", base)
	if got, want := read("c2"), at(base.Add(2*time.Hour)); got != want {
		t.Errorf("c2 after raising its own row past the \"\" row: %s, want %s", got, want)
	}
	if got, want := read("c1"), at(base.Add(time.Hour)); got != want {
		t.Errorf("c1 reads the \"\" row, which an earlier advance must not lower: %s, want %s", got, want)
	}
	want := horizonRows(horizonRow{"", base.Add(time.Hour).UnixMicro()}, horizonRow{"c1", base.UnixMicro()}, horizonRow{"c2", base.Add(2 * time.Hour).UnixMicro()})
	if got := horizons(t, db, h, tab); got != want {
		t.Errorf("HorizonsSQL: %s, want %s", got, want)
	}
}
