package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// Coalesced transactions (WithCoalescing) on every dialect's real
// database. A group closes when it is full (Max is the number of calls a
// test makes at once, the wait a whole second), so a test knows its calls
// shared one transaction; each handler records the *sql.Tx it ran in to
// prove it.

// coDB is a database under test: its dialect, a pool, a claim table and an
// audit table (one row per applied effect, no unique key, so a double
// application shows) named for the test.
type coDB struct {
	name  string
	d     dialect.Dialect
	db    *sql.DB
	table string
	audit string
	ph    func(n int) string // the n-th placeholder
	// savepoints is the design under test (Coalescing.Savepoints).
	savepoints bool
}

// coDBs returns the databases every coalescing test runs on: Postgres,
// MariaDB (skipped without one, outside CI) and SQLite.
func coDBs() []func(t *testing.T) *coDB {
	dollar := func(n int) string { return fmt.Sprintf("$%d", n) }
	qmark := func(int) string { return "?" }
	pg := func(t *testing.T) *coDB {
		db := openGuarded(t, "pq", 16)
		s := tempSchema(t, db)
		return setupCoDB(t, &coDB{name: "postgres", d: postgres.New(), db: db, table: s + ".claims", audit: s + ".audit", ph: dollar})
	}
	maria := func(t *testing.T) *coDB {
		db, err := idempotent.OpenGuarded("mysql", mysqlDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeChecked(t, db) })
		c := &coDB{name: "mariadb", d: mysql.New(), db: db, table: uniqueName("co"), audit: uniqueName("coaudit"), ph: qmark}
		t.Cleanup(func() {
			for _, s := range []string{c.table, c.table + "_horizon", c.audit} {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + s)
			}
		})
		return setupCoDB(t, c)
	}
	lite := func(t *testing.T) *coDB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "coalesce.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeChecked(t, db) })
		return setupCoDB(t, &coDB{name: "sqlite", d: sqlite.New(), db: db, table: "claims", audit: "audit", ph: qmark})
	}
	return []func(t *testing.T) *coDB{pg, maria, lite}
}

func setupCoDB(t *testing.T, c *coDB) *coDB {
	t.Helper()
	if _, err := c.db.Exec("CREATE TABLE " + c.audit + " (k VARCHAR(200) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	mw := c.mw(t, 2)
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// mw returns a Middleware on c whose groups close at max members.
func (c *coDB) mw(t *testing.T, max int, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	opts = append([]idempotent.Option{idempotent.WithTable(c.table), idempotent.WithCoalescing(idempotent.Coalescing{Max: max, Wait: time.Second, Savepoints: c.savepoints})}, opts...)
	mw, err := idempotent.New(c.db, c.d, "coalesce", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// apply is the effect of key k: one audit row.
func (c *coDB) apply(ctx context.Context, tx *sql.Tx, k string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+c.audit+" (k) VALUES ("+c.ph(1)+")", k)
	return err
}

// audited returns how many audit rows and claims key k has.
func (c *coDB) audited(t *testing.T, k string) (effects, claims int) {
	t.Helper()
	if err := c.db.QueryRow("SELECT COUNT(*) FROM "+c.audit+" WHERE k = "+c.ph(1), k).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if err := c.db.QueryRow("SELECT COUNT(*) FROM "+c.table+" WHERE consumer = 'coalesce' AND message_key = "+c.ph(1), k).Scan(&claims); err != nil {
		t.Fatal(err)
	}
	return effects, claims
}

// wantAudit fails the test unless every key of applied has exactly one
// effect and one claim, and every key of absent none.
func (c *coDB) wantAudit(t *testing.T, applied, absent []string) {
	t.Helper()
	for _, k := range applied {
		if e, n := c.audited(t, k); e != 1 || n != 1 {
			t.Errorf("%s: %d effects and %d claims, want 1 and 1", k, e, n)
		}
	}
	for _, k := range absent {
		if e, n := c.audited(t, k); e != 0 || n != 0 {
			t.Errorf("%s: %d effects and %d claims, want none", k, e, n)
		}
	}
}

// coResult is one call's result; Tx is the transaction its handler last
// ran in.
type coResult = testenv.Call[*sql.Tx]

// callAll calls ProcessMessage once per key at the same time, with
// handler(key) as each one's effect, and returns the results in the order
// of keys.
func callAll(mw *idempotent.Middleware, keys []string, handler func(k string, res *coResult) idempotent.TxFunc) []coResult {
	return testenv.CallAll(keys, func(k string, r *coResult) (idempotent.Outcome, error) {
		return mw.ProcessMessage(context.Background(), idempotent.Message{Key: k}, handler(k, r))
	})
}

func TestCoalescedGroup(t *testing.T) {
	for _, savepoints := range []bool{false, true} {
		for i, open := range coDBs() {
			name := []string{"postgres", "mariadb", "sqlite"}[i]
			if savepoints {
				name += "/savepoints"
			}
			t.Run(name, func(t *testing.T) {
				testCoalescedGroup(t, func(t *testing.T) *coDB {
					c := open(t)
					c.savepoints = savepoints
					return c
				})
			})
		}
	}
}

func testCoalescedGroup(t *testing.T, open func(t *testing.T) *coDB) {
	{
		bad := errors.New("bad payload")
		t.Run("one handler fails: only its message fails, the rest commit", func(t *testing.T) {
			c := open(t)
			keys := []string{"k1", "k2", "k3", "k4"}
			res := callAll(c.mw(t, len(keys)), keys, func(k string, r *coResult) idempotent.TxFunc {
				return func(ctx context.Context, tx *sql.Tx) error {
					r.Tx = tx
					if err := c.apply(ctx, tx, k); err != nil || k != "k2" {
						return err
					}
					return bad
				}
			})
			for i, r := range res {
				if i == 1 {
					if !errors.Is(r.Err, bad) || r.Outcome != 0 {
						t.Errorf("%s: %+v, want its own error", c.name, r)
					}
				} else if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Errorf("%s %s: %+v, want applied", c.name, keys[i], r)
				}
			}
			testenv.SameTx(t, res, 0, 2, 3)
			c.wantAudit(t, []string{"k1", "k3", "k4"}, []string{"k2"})
		})
		t.Run("a panicking handler: the panic reaches its caller, the others commit", func(t *testing.T) {
			c := open(t)
			keys := []string{"p1", "p2", "p3"}
			res := callAll(c.mw(t, len(keys)), keys, func(k string, r *coResult) idempotent.TxFunc {
				return func(ctx context.Context, tx *sql.Tx) error {
					r.Tx = tx
					if err := c.apply(ctx, tx, k); err != nil || k != "p1" {
						return err
					}
					panic("boom")
				}
			})
			if res[0].Panicked != "boom" || res[1].Outcome != idempotent.Applied || res[2].Outcome != idempotent.Applied || res[1].Err != nil || res[2].Err != nil {
				t.Fatalf("%s: %+v, want p1's panic and p2, p3 applied", c.name, res)
			}
			testenv.SameTx(t, res, 1, 2)
			c.wantAudit(t, []string{"p2", "p3"}, []string{"p1"})
		})
		t.Run("a caller's context cancelled mid-group: its error, its work undone", func(t *testing.T) {
			c := open(t)
			mw := c.mw(t, 2)
			actx, cancel := context.WithCancel(context.Background())
			defer cancel()
			aRan, bHeld, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
			aErr := make(chan error, 1)
			go func() {
				_, err := mw.ProcessMessage(actx, idempotent.Message{Key: "a"}, func(ctx context.Context, tx *sql.Tx) error {
					defer close(aRan)
					return c.apply(ctx, tx, "a")
				})
				aErr <- err
			}()
			bRuns := 0
			var bOut idempotent.Outcome
			var bErr error
			bDone := make(chan struct{})
			go func() {
				defer close(bDone)
				bOut, bErr = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "b"}, func(ctx context.Context, tx *sql.Tx) error {
					if bRuns++; bRuns == 1 {
						<-aRan // a's handler ran first: keys go in order
						close(bHeld)
						<-release
					}
					return c.apply(ctx, tx, "b")
				})
			}()
			<-bHeld
			cancel()
			if err := <-aErr; !errors.Is(err, context.Canceled) {
				t.Fatalf("%s: a got %v, want context.Canceled", c.name, err)
			}
			close(release)
			<-bDone
			if bErr != nil || bOut != idempotent.Applied || bRuns != 2 {
				t.Fatalf("%s: b got (%v, %v) after %d runs, want applied after 2", c.name, bOut, bErr, bRuns)
			}
			c.wantAudit(t, []string{"b"}, []string{"a"})
		})
		t.Run("duplicates inside one group and across groups: one effect each", func(t *testing.T) {
			c := open(t)
			// 24 calls of 4 keys, groups of 4: the same key in one group
			// and in groups running at once.
			var keys []string
			for i := range 24 {
				keys = append(keys, fmt.Sprintf("d%d", i%4))
			}
			res := callAll(c.mw(t, 4), keys, func(k string, _ *coResult) idempotent.TxFunc {
				return func(ctx context.Context, tx *sql.Tx) error { return c.apply(ctx, tx, k) }
			})
			applied := map[string]int{}
			for i, r := range res {
				if r.Err != nil || r.Panicked != nil {
					t.Fatalf("%s %s: %+v", c.name, keys[i], r)
				}
				if r.Outcome == idempotent.Applied {
					applied[keys[i]]++
				}
			}
			if fmt.Sprint(applied) != "map[d0:1 d1:1 d2:1 d3:1]" {
				t.Errorf("%s: applied %v, want each key once", c.name, applied)
			}
			c.wantAudit(t, []string{"d0", "d1", "d2", "d3"}, nil)
		})
	}
}

// TestCoalescedGroupLostCommit cuts the answer to a group's COMMIT, which
// landed: the group is retried, finds its claims, and every message is
// applied exactly once.
func TestCoalescedGroupLostCommit(t *testing.T) {
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	proxy := newCommitCutter(t, dsnHost(t, pgDSN))
	c := coDBs()[0](t)
	via := openGuardedDSN(t, "pq", dsnWithHost(t, pgDSN, proxy.Addr()), 4)
	mw, err := idempotent.New(via, c.d, "coalesce", idempotent.WithTable(c.table), idempotent.WithCoalescing(idempotent.Coalescing{Max: 3, Wait: time.Second}),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"l1", "l2", "l3"}
	var armed sync.Once
	res := callAll(mw, keys, func(k string, r *coResult) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			r.Tx = tx
			armed.Do(proxy.Arm) // the first attempt's COMMIT is cut
			return c.apply(ctx, tx, k)
		}
	})
	for i, r := range res {
		if r.Err != nil || r.Outcome != idempotent.Duplicate {
			t.Errorf("%s: %+v, want duplicate (the lost COMMIT landed)", keys[i], r)
		}
	}
	if n := proxy.cut.Load(); n != 1 {
		t.Fatalf("%d commits cut, want 1", n)
	}
	testenv.SameTx(t, res, 0, 1, 2)
	c.wantAudit(t, keys, nil)
}

// TestCoalescedGroupLockWait holds a row lock outside the library and
// sends a group two messages, one of whose handlers needs that row: past
// Coalescing.LockWait that message leaves the group, the other commits
// while the lock is still held, and the first is applied alone once the
// lock goes — each exactly once, in both designs.
func TestCoalescedGroupLockWait(t *testing.T) {
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	for _, savepoints := range []bool{false, true} {
		t.Run(fmt.Sprintf("savepoints=%v", savepoints), func(t *testing.T) {
			c := coDBs()[0](t)
			ctx := context.Background()
			rows := c.audit + "_rows"
			if _, err := c.db.Exec("CREATE TABLE " + rows + " (id int PRIMARY KEY, n int NOT NULL); INSERT INTO " + rows + " VALUES (1, 0)"); err != nil {
				t.Fatal(err)
			}
			mw, err := idempotent.New(c.db, c.d, "coalesce", idempotent.WithTable(c.table),
				idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: savepoints, LockWait: 50 * time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			holder, err := c.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback() }()
			if _, err := holder.Exec("SELECT n FROM " + rows + " WHERE id = 1 FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			var hotRuns atomic.Int32
			hot := make(chan coResult, 1)
			cold := make(chan coResult, 1)
			var coldTx, firstColdTx, firstHotTx *sql.Tx
			go func() {
				var r coResult
				r.Outcome, r.Err = mw.ProcessMessage(ctx, idempotent.Message{Key: "hot"}, func(ctx context.Context, tx *sql.Tx) error {
					if hotRuns.Add(1) == 1 {
						firstHotTx = tx
					}
					r.Tx = tx
					if _, err := tx.ExecContext(ctx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 1"); err != nil {
						return err
					}
					return c.apply(ctx, tx, "hot")
				})
				hot <- r
			}()
			go func() {
				var r coResult
				r.Outcome, r.Err = mw.ProcessMessage(ctx, idempotent.Message{Key: "cold"}, func(ctx context.Context, tx *sql.Tx) error {
					if firstColdTx == nil {
						firstColdTx = tx
					}
					coldTx, r.Tx = tx, tx
					return c.apply(ctx, tx, "cold")
				})
				cold <- r
			}()
			select {
			case r := <-cold:
				if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Fatalf("cold: %+v, want applied", r)
				}
			case r := <-hot:
				t.Fatalf("hot finished first, while its row was locked: %+v", r)
			case <-time.After(30 * time.Second):
				t.Fatal("cold did not commit while the hot row was locked: its group waited for the lock")
			}
			if e, n := c.audited(t, "cold"); e != 1 || n != 1 {
				t.Fatalf("cold: %d effects and %d claims while the lock is held, want 1 and 1", e, n)
			}
			if err := holder.Commit(); err != nil {
				t.Fatal(err)
			}
			r := <-hot
			if r.Err != nil || r.Outcome != idempotent.Applied {
				t.Fatalf("hot: %+v, want applied", r)
			}
			if firstHotTx != firstColdTx || r.Tx == coldTx || hotRuns.Load() != 2 {
				t.Errorf("hot ran %d times; its first run should share cold's first transaction and its last run have one of its own", hotRuns.Load())
			}
			c.wantAudit(t, []string{"hot", "cold"}, nil)
			var n int
			if err := c.db.QueryRow("SELECT n FROM " + rows + " WHERE id = 1").Scan(&n); err != nil || n != 1 {
				t.Fatalf("hot row n = %d (%v), want 1", n, err)
			}
		})
	}
}
