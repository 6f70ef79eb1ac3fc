package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/sqlite"
)

// Issue 20, case 8: retention on every dialect. The tests of
// retention_test.go, through the middleware, on MariaDB and SQLite.

// retDialect is a database under test with its dialect.
type retDialect struct {
	name    string
	dialect dialect.Dialect
	open    func(t *testing.T) *sql.DB // a pool of its own, as another process has
	table   func(t *testing.T, db *sql.DB) string
}

func retDialects(t *testing.T) []retDialect {
	path := filepath.Join(t.TempDir(), "retention.db")
	dialects := []retDialect{{
		name:    "sqlite",
		dialect: sqlite.New(),
		open: func(t *testing.T) *sql.DB {
			db, err := sqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeChecked(t, db) })
			return db
		},
	}}
	if dsn := mysqlDSNOrSkip(t); dsn != "" {
		dialects = append(dialects, retDialect{
			name:    "mysql",
			dialect: mysql.New(),
			open: func(t *testing.T) *sql.DB {
				db, err := sql.Open("mysql", dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { closeChecked(t, db) })
				return db
			},
		})
	}
	for i := range dialects {
		dialects[i].table = func(t *testing.T, db *sql.DB) string {
			name := uniqueName("ret")
			t.Cleanup(func() {
				for _, s := range []string{name, name + "_horizon"} {
					_, _ = db.Exec("DROP TABLE IF EXISTS " + s)
				}
			})
			return name
		}
	}
	return dialects
}

// mysqlDSNOrSkip is mysqlDSN for a test that also runs without MariaDB: ""
// when there is none (outside CI).
func mysqlDSNOrSkip(t *testing.T) (dsn string) {
	t.Helper()
	ok := t.Run("mysql available", func(t *testing.T) { dsn = mysqlDSN(t) })
	if !ok {
		t.FailNow()
	}
	return dsn
}

// retSeed inserts n claims of consumer keyed prefix-1 … prefix-n, processed
// at at, with SQL both MariaDB and SQLite run.
// (A recursive query of at most 1,000 rows at a time: MariaDB's
// max_recursive_iterations may be 1,000.)
func retSeed(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, at time.Time) {
	t.Helper()
	for from := 1; from <= n; from += 1000 {
		_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, message_key, processed_at)
WITH RECURSIVE g(i) AS (SELECT %d UNION ALL SELECT i + 1 FROM g WHERE i < %d)
SELECT '%s', CONCAT('%s-', i), '%s' FROM g`, table, from, min(n, from+999), consumer, prefix, at.UTC().Format("2006-01-02 15:04:05.000")))
		if err != nil {
			t.Fatal(err)
		}
	}
}

func retCountWhere(t testing.TB, db *sql.DB, table, where string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table + " WHERE " + where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCleanupOnEveryDialect: Cleanup and CleanupConsumer on MariaDB and
// SQLite delete exactly the claims older than the window (plus the
// margin), in batches of BatchSize, of one consumer or of all, and Stats
// counts what is left.
func TestCleanupOnEveryDialect(t *testing.T) {
	for _, rd := range retDialects(t) {
		t.Run(rd.name, func(t *testing.T) {
			db := rd.open(t)
			table := rd.table(t, db)
			now := time.Now().UTC().Truncate(time.Millisecond)
			const window, skew = 30 * 24 * time.Hour, 5 * time.Minute
			clock := func() time.Time { return now }
			ct, err := idempotent.NewClaimTable(db, rd.dialect, idempotent.WithTable(table), idempotent.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := ct.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			cutoff := now.Add(-window - skew)
			retSeed(t, db, table, "loyalty", "expired", 2500, cutoff.Add(-time.Hour))
			retSeed(t, db, table, "loyalty", "just-expired", 3, cutoff.Add(-time.Millisecond))
			retSeed(t, db, table, "loyalty", "in-margin", 7, cutoff.Add(time.Minute))
			retSeed(t, db, table, "loyalty", "at-cutoff", 5, cutoff)
			retSeed(t, db, table, "loyalty", "fresh", 13, now)
			retSeed(t, db, table, "analytics", "expired", 100, cutoff.Add(-time.Hour))

			opts := idempotent.DefaultCleanupOptions()
			opts.BatchSize, opts.DryRun = 1000, true
			if n, err := ct.CleanupConsumer(ctx, "loyalty", opts); err != nil || n != 2503 {
				t.Fatalf("dry run = (%d, %v), want 2503", n, err)
			}
			opts.DryRun = false
			var got []int64
			opts.Progress = func(p idempotent.CleanupProgress) { got = append(got, p.Deleted) }
			if n, err := ct.CleanupConsumer(ctx, "loyalty", opts); err != nil || n != 2503 {
				t.Fatalf("CleanupConsumer = (%d, %v), want 2503", n, err)
			}
			if fmt.Sprint(got) != "[1000 1000 503 0]" {
				t.Errorf("batches deleted %v, want [1000 1000 503 0]", got)
			}
			for prefix, want := range map[string]int64{"expired": 0, "just-expired": 0, "in-margin": 7, "at-cutoff": 5, "fresh": 13} {
				if n := retCountWhere(t, db, table, "consumer = 'loyalty' AND message_key LIKE '"+prefix+"-%'"); n != want {
					t.Errorf("%s: %d claims left, want %d", prefix, n, want)
				}
			}
			stats, err := ct.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(stats) != 2 || stats[0].Consumer != "analytics" || stats[0].Claims != 100 || !stats[0].Oldest.Equal(cutoff.Add(-time.Hour)) ||
				stats[1].Consumer != "loyalty" || stats[1].Claims != 25 || !stats[1].Oldest.Equal(cutoff) || !stats[1].Newest.Equal(now) {
				t.Errorf("Stats = %+v", stats)
			}
			opts.Progress = nil
			if n, err := ct.Cleanup(ctx, opts); err != nil || n != 100 {
				t.Fatalf("Cleanup of every consumer = (%d, %v), want 100", n, err)
			}
			if n := retCountWhere(t, db, table, "1 = 1"); n != 25 {
				t.Fatalf("%d claims left, want 25", n)
			}
		})
	}
}

// TestConcurrentCleanupOnEveryDialect: four Cleanups at once, each with a
// pool of its own (four processes), on MariaDB and SQLite. Between them
// every expired claim is deleted exactly once: the counts add up to the
// 5,000. On MariaDB a runner that finds another in a batch stops at once
// with ErrCleanupBusy; on SQLite, where the lock is the write lock, the
// runners take turns and all finish.
func TestConcurrentCleanupOnEveryDialect(t *testing.T) {
	for _, rd := range retDialects(t) {
		t.Run(rd.name, func(t *testing.T) {
			db := rd.open(t)
			table := rd.table(t, db)
			ctx := context.Background()
			mk := func(db *sql.DB) *idempotent.ClaimTable {
				ct, err := idempotent.NewClaimTable(db, rd.dialect, idempotent.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				return ct
			}
			if err := mk(db).EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			retSeed(t, db, table, "loyalty", "old", 5000, time.Now().AddDate(0, -2, 0))
			retSeed(t, db, table, "loyalty", "new", 10, time.Now())
			opts := idempotent.DefaultCleanupOptions()
			opts.BatchSize = 100
			const runners = 4
			deleted := make([]int64, runners)
			errs := make([]error, runners)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range runners {
				ct := mk(rd.open(t))
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					deleted[i], errs[i] = ct.Cleanup(ctx, opts)
				}()
			}
			close(start)
			wg.Wait()
			var total int64
			busy := 0
			for i, err := range errs {
				total += deleted[i]
				switch {
				case err == nil:
				case errors.Is(err, idempotent.ErrCleanupBusy) && rd.name != "sqlite":
					busy++
				default:
					t.Fatalf("runner %d: %v", i, err)
				}
			}
			// The runners that stopped busy left the rest to the others; a
			// last run in case the last holder stopped busy too.
			rest, err := mk(db).Cleanup(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if total+rest != 5000 {
				t.Errorf("the runners deleted %v (%d) and the last run %d: want 5000 in all", deleted, total, rest)
			}
			if n := retCountWhere(t, db, table, "1 = 1"); n != 10 {
				t.Errorf("%d claims left, want the 10 new ones", n)
			}
			t.Logf("runners deleted %v; %d stopped busy; the last run deleted %d", deleted, busy, rest)
		})
	}
}
