package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// A handler cannot break its neighbours: in a coalesced group of four, the
// second member's handler makes one of the mistakes a handler can make to
// the group's transaction, on every database/sql target — Postgres through
// lib/pq and pgx's stdlib, each opened with and without GuardConnector,
// MariaDB with and without it, SQLite — in both designs. Whatever it does,
// the other three members end applied (or duplicate, when the culprit
// committed them with its own claim) with exactly one effect and one claim
// each, and the culprit fails alone, its own claim and effect together or
// both absent except where the mistake itself writes outside the
// transaction.

// mistakeDB is a database under test for the handler mistakes.
type mistakeDB struct {
	*coDB
	kind    string // "postgres", "mariadb" or "sqlite"
	drv     string // "pq", "pgx", "mysql" or "sqlite"
	guarded bool
	// other is a pool of its own for the sessions a mistake needs beside
	// the group's (a deadlock's other side); mon watches Postgres.
	other, mon *sql.DB
	// dl is a table of two rows the deadlocks lock, dlw one the other side
	// of a MariaDB deadlock writes to weigh more than the handler's.
	dl, dlw string
}

// mistakeTarget opens a database under test for the handler mistakes.
type mistakeTarget struct {
	name string
	open func(t *testing.T) *mistakeDB
}

// mistakeDBs returns the targets of the handler mistakes.
func mistakeDBs() []mistakeTarget {
	dollar := func(n int) string { return fmt.Sprintf("$%d", n) }
	qmark := func(int) string { return "?" }
	pg := func(drv string, guarded bool) func(t *testing.T) *mistakeDB {
		return func(t *testing.T) *mistakeDB {
			var db *sql.DB
			if guarded {
				db = openGuarded(t, drv, 6)
			} else {
				if pgDSN == "" {
					t.Skip(skipReason)
				}
				db = sql.OpenDB(connector(t, drv, routedDSN(t, drv)))
				db.SetMaxOpenConns(6)
				t.Cleanup(func() { closeChecked(t, db) })
			}
			mon := openMonitor(t)
			s := tempSchema(t, mon)
			c := &mistakeDB{coDB: &coDB{name: "postgres", d: postgres.New(), db: db, table: s + ".claims", audit: s + ".audit", ph: dollar},
				kind: "postgres", drv: drv, guarded: guarded, other: mon, mon: mon, dl: s + ".dl"}
			setupCoDB(t, c.coDB)
			if _, err := mon.Exec("CREATE TABLE " + c.dl + " (id int PRIMARY KEY, v int NOT NULL); INSERT INTO " + c.dl + " VALUES (1, 0), (2, 0)"); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	maria := func(guarded bool) func(t *testing.T) *mistakeDB {
		return func(t *testing.T) *mistakeDB {
			dsn := mysqlDSN(t)
			open := func(guarded bool) *sql.DB {
				var db *sql.DB
				var err error
				if guarded {
					db, err = idempotent.OpenGuarded("mysql", dsn)
				} else {
					db, err = sql.Open("mysql", dsn)
				}
				if err != nil {
					t.Fatal(err)
				}
				db.SetMaxOpenConns(6)
				t.Cleanup(func() { closeChecked(t, db) })
				return db
			}
			db, other := open(guarded), open(false)
			c := &mistakeDB{coDB: &coDB{name: "mariadb", d: mysql.New(), db: db, table: uniqueName("co"), audit: uniqueName("coaudit"), ph: qmark},
				kind: "mariadb", drv: "mysql", guarded: guarded, other: other, dl: uniqueName("dl"), dlw: uniqueName("dlw")}
			t.Cleanup(func() {
				for _, s := range []string{c.table, mysql.HorizonName(c.table), c.audit, c.dl, c.dlw} {
					_, _ = other.Exec("DROP TABLE IF EXISTS " + s)
				}
			})
			setupCoDB(t, c.coDB)
			for _, q := range []string{
				"CREATE TABLE " + c.dl + " (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
				"INSERT INTO " + c.dl + " VALUES (1, 0), (2, 0)",
				"CREATE TABLE " + c.dlw + " (id INT NOT NULL) ENGINE=InnoDB",
			} {
				if _, err := other.Exec(q); err != nil {
					t.Fatal(err)
				}
			}
			return c
		}
	}
	lite := func(t *testing.T) *mistakeDB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "mistakes.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeChecked(t, db) })
		c := &mistakeDB{coDB: &coDB{name: "sqlite", d: sqlite.New(), db: db, table: "claims", audit: "audit", ph: qmark}, kind: "sqlite", drv: "sqlite"}
		setupCoDB(t, c.coDB)
		return c
	}
	return []mistakeTarget{
		{"postgres/pq/guarded", pg("pq", true)}, {"postgres/pq", pg("pq", false)},
		{"postgres/pgx/guarded", pg("pgx", true)}, {"postgres/pgx", pg("pgx", false)},
		{"mariadb/guarded", maria(true)}, {"mariadb", maria(false)}, {"sqlite", lite},
	}
}

// mistakeCase is one group's run: the culprit's cancel and what its
// mistake leaves to be finished once the group is over.
type mistakeCase struct {
	t       *testing.T
	c       *mistakeDB
	cancel  context.CancelFunc // the culprit's caller's context
	release chan struct{}      // closed once the other members returned
	after   []func()           // run once every member returned
	attempt int                // how many times the culprit's handler ran
}

// victim makes tx, the culprit's transaction, the victim of a deadlock
// with a session of its own (deadlockVictim).
func (mc *mistakeCase) victim(ctx context.Context, tx *sql.Tx) error {
	err, after := deadlockVictim(mc.t, mc.c, ctx, tx)
	mc.after = append(mc.after, after)
	return err
}

// deadlockVictim makes tx, a handler's transaction on c, the victim of a
// deadlock with a session of c.other of its own, and returns the error of
// the handler's statement that closed the cycle, and what finishes the
// other session once tx has ended.
func deadlockVictim(t *testing.T, c *mistakeDB, ctx context.Context, tx *sql.Tx) (error, func()) {
	bg := context.Background()
	s, err := c.other.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	upd := func(id int) string { return fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE id = %d", c.dl, id) }
	var waiting func() (bool, error)
	if c.kind == "postgres" {
		// The other session never looks for the deadlock; the handler's
		// does, 10ms after it starts waiting, when the cycle is closed.
		if _, err := s.Exec("SET LOCAL deadlock_timeout = '1h'"); err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := s.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		waiting = func() (bool, error) {
			var n int
			err := c.mon.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", pid).Scan(&n)
			return n == 1, err
		}
	} else {
		// InnoDB finds the deadlock when the cycle closes, whichever side
		// closes it, and rolls back the lighter transaction: the other
		// session writes fifty rows first.
		vals := make([]string, 50)
		for i := range vals {
			vals[i] = fmt.Sprintf("(%d)", i)
		}
		if _, err := s.Exec("INSERT INTO " + c.dlw + " VALUES " + strings.Join(vals, ", ")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Exec(upd(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, upd(1)); err != nil {
		t.Fatalf("the handler's first lock: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Exec(upd(1)) // waits for the handler's lock
		done <- err
	}()
	after := func() {
		if err := <-done; err != nil {
			t.Errorf("the deadlock's other side: %v", err)
		}
		_ = s.Rollback()
	}
	if c.kind == "postgres" {
		waitFor(t, "the deadlock's other side to wait", waiting)
		if _, err := tx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '10ms'"); err != nil {
			return err, after
		}
	}
	_, err = tx.ExecContext(ctx, upd(2))
	return err, after
}

// A mistake is what the culprit's handler does after applying its effect,
// where it applies (on), and what it costs the culprit: its error, and its
// effects and claims afterwards.
type mistake struct {
	name string
	on   func(c *mistakeDB) bool
	do   func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error
	// want returns what the culprit must get: wantErr judges its error
	// (nil: it must be applied), and its effects and claims.
	want func(c *mistakeDB) (wantErr func(error) bool, effects, claims int)
}

var errHandler = errors.New("the handler's own failure")

func isAutocommit(err error) bool { return errors.Is(err, idempotent.ErrAutocommit) }

func isCanceled(err error) bool { return errors.Is(err, context.Canceled) }

// fixed is a want that does not depend on the target.
func fixed(wantErr func(error) bool, effects, claims int) func(*mistakeDB) (func(error) bool, int, int) {
	return func(*mistakeDB) (func(error) bool, int, int) { return wantErr, effects, claims }
}

// committedUnlessGuarded is the want of a mistake that commits the group's
// transaction: the guard refuses it before, otherwise the culprit's claim
// commits with its effect.
func committedUnlessGuarded(c *mistakeDB) (func(error) bool, int, int) {
	if c.guarded {
		return isAutocommit, 0, 0
	}
	return isAutocommit, 1, 1
}

func always(*mistakeDB) bool { return true }

func onPostgres(c *mistakeDB) bool { return c.kind == "postgres" }

var mistakes = []mistake{
	{name: "returns an error", on: always,
		do:   func(*mistakeCase, context.Context, *sql.Tx, string) error { return errHandler },
		want: fixed(func(err error) bool { return errors.Is(err, errHandler) }, 0, 0)},
	{name: "panics", on: always,
		do:   func(*mistakeCase, context.Context, *sql.Tx, string) error { panic("boom") },
		want: fixed(nil, 0, 0)}, // judged by the panic
	{name: "swallows an error that aborted the transaction", on: onPostgres,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_, _ = tx.ExecContext(ctx, "SELECT 1/0")
			return nil
		},
		want: fixed(isAutocommit, 0, 0)},
	{name: "swallows a deadlock the database rolled the transaction back for", on: func(c *mistakeDB) bool { return c.kind == "mariadb" },
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_ = mc.victim(ctx, tx)
			return nil
		},
		want: fixed(isAutocommit, 0, 0)},
	{name: "swallows a deadlock and writes on", on: func(c *mistakeDB) bool { return c.kind == "mariadb" },
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_ = mc.victim(ctx, tx)
			_ = mc.c.apply(ctx, tx, k) // refused by the guard; on its own without
			return nil
		},
		want: func(c *mistakeDB) (func(error) bool, int, int) {
			if c.guarded {
				return isAutocommit, 0, 0
			}
			return isAutocommit, 1, 0 // the write after the deadlock committed on its own
		}},
	{name: "is a deadlock victim", on: func(c *mistakeDB) bool { return c.kind != "sqlite" },
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			if mc.attempt > 1 {
				return nil
			}
			return mc.victim(ctx, tx) // retried for the whole group
		},
		want: fixed(nil, 1, 1)},
	{name: "calls tx.Commit", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_ = tx.Commit()
			return nil
		},
		want: committedUnlessGuarded},
	{name: "calls tx.Rollback", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_ = tx.Rollback()
			return nil
		},
		want: fixed(isAutocommit, 0, 0)},
	{name: "runs COMMIT", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_, _ = tx.ExecContext(ctx, "COMMIT")
			return nil
		},
		want: committedUnlessGuarded},
	{name: "runs ROLLBACK", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_, _ = tx.ExecContext(ctx, "ROLLBACK")
			return nil
		},
		want: fixed(isAutocommit, 0, 0)},
	{name: "runs COMMIT inside a multi-statement string", on: func(c *mistakeDB) bool { return c.drv == "pq" },
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_, err := tx.ExecContext(ctx, "SELECT 1; COMMIT")
			return err
		},
		want: fixed(isAutocommit, 1, 1)}, // the guard sees the first statement only
	{name: "writes via the *sql.DB", on: func(c *mistakeDB) bool { return c.kind != "sqlite" },
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			_, _ = mc.c.db.ExecContext(ctx, "INSERT INTO "+mc.c.audit+" (k) VALUES ("+mc.c.ph(1)+")", k)
			return nil
		},
		want: func(c *mistakeDB) (func(error) bool, int, int) {
			if c.guarded {
				return isAutocommit, 0, 0
			}
			return nil, 2, 1 // its own second effect, committed on its own
		}},
	{name: "returns when its context is cancelled", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			mc.cancel()
			<-ctx.Done()
			return ctx.Err()
		},
		want: fixed(isCanceled, 0, 0)},
	{name: "has its statement cancelled with its context", on: onPostgres,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			marker := uniqueName("sleep")
			go func() {
				waitFor(mc.t, "the culprit's statement to run", func() (bool, error) {
					var n int
					err := mc.c.mon.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND position($1 in query) > 0 AND pid <> pg_backend_pid()", marker).Scan(&n)
					return n == 1, err
				})
				mc.cancel()
			}()
			_, err := tx.ExecContext(ctx, "SELECT pg_sleep(60) /* "+marker+" */")
			return err
		},
		want: fixed(func(err error) bool { return err != nil }, 0, 0)},
	{name: "hangs past its context", on: always,
		do: func(mc *mistakeCase, ctx context.Context, tx *sql.Tx, k string) error {
			mc.cancel()
			<-mc.release // heeds no context: returns once the others have
			return nil
		},
		want: fixed(isCanceled, 0, 0)},
}

func TestCoalescedGroupHandlerMistakes(t *testing.T) {
	for _, target := range mistakeDBs() {
		t.Run(target.name, func(t *testing.T) {
			c := target.open(t)
			for _, savepoints := range []bool{false, true} {
				design := "optimistic"
				if savepoints {
					design = "savepoints"
				}
				for _, m := range mistakes {
					if m.on(c) {
						t.Run(design+"/"+m.name, func(t *testing.T) { runMistake(t, c, savepoints, m) })
					}
				}
			}
		})
	}
}

// runMistake runs one group of four on c whose second member's handler
// makes mistake m, and judges every member.
func runMistake(t *testing.T, c *mistakeDB, savepoints bool, m mistake) {
	mw, err := idempotent.New(c.db, c.d, "coalesce", idempotent.WithTable(c.table),
		idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Second, Savepoints: savepoints, LockWait: -1}),
		idempotent.WithRetry(fastRetry(5)))
	if err != nil {
		t.Fatal(err)
	}
	prefix := uniqueName("m")
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-k%d", prefix, i+1)
	}
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mc := &mistakeCase{t: t, c: c, cancel: cancel, release: make(chan struct{})}
	results := make([]chan coResult, len(keys))
	for i, k := range keys {
		results[i] = make(chan coResult, 1)
		ctx := context.Background()
		handler := func(ctx context.Context, tx *sql.Tx) error { return c.apply(ctx, tx, k) }
		if i == 1 {
			ctx = cctx
			handler = func(ctx context.Context, tx *sql.Tx) error {
				mc.attempt++
				if err := c.apply(ctx, tx, k); err != nil {
					return err
				}
				return m.do(mc, ctx, tx, k)
			}
		}
		go func() {
			var r coResult
			defer func() {
				r.Panicked = recover()
				results[i] <- r
			}()
			r.Outcome, r.Err = mw.ProcessMessage(ctx, idempotent.Message{Key: k}, handler)
		}()
	}
	var res [4]coResult
	for _, i := range []int{0, 2, 3} {
		res[i] = <-results[i]
	}
	close(mc.release)
	res[1] = <-results[1]
	for _, f := range mc.after {
		f()
	}
	for _, i := range []int{0, 2, 3} {
		r := res[i]
		if r.Err != nil || r.Panicked != nil || (r.Outcome != idempotent.Applied && r.Outcome != idempotent.Duplicate) {
			t.Errorf("%s, a neighbour of the culprit: %v, %v (panic %v); want applied or duplicate", keys[i], r.Outcome, r.Err, r.Panicked)
		}
		if e, n := c.audited(t, keys[i]); e != 1 || n != 1 {
			t.Errorf("%s, a neighbour of the culprit: %d effects and %d claims, want 1 and 1", keys[i], e, n)
		}
	}
	wantErr, effects, claims := m.want(c)
	r := res[1]
	switch {
	case m.name == "panics":
		if r.Panicked != "boom" {
			t.Errorf("the culprit: %v, %v, panic %v; want its panic", r.Outcome, r.Err, r.Panicked)
		}
	case wantErr == nil:
		if r.Err != nil || r.Outcome != idempotent.Applied {
			t.Errorf("the culprit: %v, %v; want applied", r.Outcome, r.Err)
		}
	case !wantErr(r.Err) || r.Outcome != 0:
		t.Errorf("the culprit: %v, %v; want its failure", r.Outcome, r.Err)
	}
	if e, n := c.audited(t, keys[1]); e != effects || n != claims {
		t.Errorf("the culprit: %d effects and %d claims, want %d and %d", e, n, effects, claims)
	}
	if t.Failed() {
		t.Logf("culprit's error: %v", r.Err)
	}
}

// TestCoalescedSwallowedDeadlockMariaDB: on MariaDB, in both designs (the
// optimistic one runs with savepoints there), a member whose handler
// swallows a deadlock — InnoDB rolled the group's transaction back and the
// session runs in autocommit mode — fails alone with ErrAutocommit, and
// the other members are applied once each, claim and effect together; with
// the guard, a statement the handler runs after it is refused.
func TestCoalescedSwallowedDeadlockMariaDB(t *testing.T) {
	for _, target := range mistakeDBs() {
		if !strings.HasPrefix(target.name, "mariadb") {
			continue
		}
		t.Run(target.name, func(t *testing.T) {
			c := target.open(t)
			for _, savepoints := range []bool{false, true} {
				for _, m := range mistakes {
					if strings.HasPrefix(m.name, "swallows a deadlock") {
						t.Run(fmt.Sprintf("savepoints=%v/%s", savepoints, m.name), func(t *testing.T) { runMistake(t, c, savepoints, m) })
					}
				}
			}
		})
	}
}

// TestGuardAfterDeadlockMariaDB: a handler of ProcessMessage on a guarded
// MariaDB that swallows a deadlock its transaction was rolled back for
// fails with ErrAutocommit — it is not reported applied with nothing
// committed — and a statement it runs after it is refused, not committed on
// its own.
func TestGuardAfterDeadlockMariaDB(t *testing.T) {
	for _, target := range mistakeDBs() {
		if target.name != "mariadb/guarded" {
			continue
		}
		c := target.open(t)
		mw, err := idempotent.New(c.db, c.d, "coalesce", idempotent.WithTable(c.table), idempotent.WithRetry(fastRetry(5)))
		if err != nil {
			t.Fatal(err)
		}
		for _, writeOn := range []bool{false, true} {
			t.Run(fmt.Sprintf("writes on=%v", writeOn), func(t *testing.T) {
				k := uniqueName("single")
				var after func()
				var dlErr, writeErr error
				out, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: k}, func(ctx context.Context, tx *sql.Tx) error {
					if err := c.apply(ctx, tx, k); err != nil {
						return err
					}
					dlErr, after = deadlockVictim(t, c, ctx, tx)
					if writeOn {
						writeErr = c.apply(ctx, tx, k)
					}
					return nil // swallowed
				})
				after()
				if dlErr == nil {
					t.Fatal("no deadlock")
				}
				if !errors.Is(err, idempotent.ErrAutocommit) || out != 0 {
					t.Errorf("ProcessMessage: %v, %v; want ErrAutocommit", out, err)
				}
				if writeOn && !errors.Is(writeErr, idempotent.ErrAutocommit) {
					t.Errorf("the statement after the deadlock: %v, want ErrAutocommit", writeErr)
				}
				if e, n := c.audited(t, k); e != 0 || n != 0 {
					t.Errorf("%d effects and %d claims, want none", e, n)
				}
			})
		}
	}
}
