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

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// The edges where a dialect meets a handler: statements MySQL and MariaDB
// commit implicitly, event times in the future, missing partitions and
// isolation levels a driver cannot begin.

// mariaEdge is a claim table and an effect counter on MariaDB.
type mariaEdge struct {
	admin        *sql.DB // plain, for setup and checks
	table, fx    string
	scratch      string // a table a handler's DDL would create
	truncateable string // a table with rows a handler's TRUNCATE would empty
}

func newMariaEdge(t *testing.T, dsn string) *mariaEdge {
	t.Helper()
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, admin) })
	e := &mariaEdge{admin: admin, table: uniqueName("claims"), fx: uniqueName("fx"), scratch: uniqueName("scratch"), truncateable: uniqueName("keep")}
	for _, q := range []string{
		"CREATE TABLE " + e.fx + " (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO " + e.fx + " VALUES (1, 0)",
		"CREATE TABLE " + e.truncateable + " (id INT PRIMARY KEY) ENGINE=InnoDB",
		"INSERT INTO " + e.truncateable + " VALUES (1), (2), (3)",
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, name := range []string{e.table, e.fx, e.scratch, e.truncateable} {
			if _, err := admin.Exec("DROP TABLE IF EXISTS " + name); err != nil {
				t.Errorf("drop %s: %v", name, err)
			}
		}
	})
	return e
}

func (e *mariaEdge) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := e.admin.QueryRow(query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *mariaEdge) effect(t *testing.T) int {
	return e.count(t, "SELECT n FROM "+e.fx+" WHERE id = 1")
}

func (e *mariaEdge) claims(t *testing.T) int {
	return e.count(t, "SELECT COUNT(*) FROM "+e.table)
}

func (e *mariaEdge) bump(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, "UPDATE "+e.fx+" SET n = n + 1 WHERE id = 1")
	return err
}

// TestMariaDBImplicitCommitIsRefusedBeforeTheServer: a handler that runs a
// statement MariaDB commits implicitly through the claim's transaction, and
// then fails, must not leave the claim committed with half its effect.
// Through GuardConnector the statement never reaches the server; the
// redelivery applies the whole effect, once.
func TestMariaDBImplicitCommitIsRefusedBeforeTheServer(t *testing.T) {
	dsn := mysqlDSN(t)
	cases := []struct {
		name  string
		stmt  func(e *mariaEdge) string
		check func(t *testing.T, e *mariaEdge)
	}{
		{"CREATE TABLE", func(e *mariaEdge) string { return "CREATE TABLE " + e.scratch + " (id INT)" }, func(t *testing.T, e *mariaEdge) {
			if n := e.count(t, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '"+e.scratch+"'"); n != 0 {
				t.Errorf("the CREATE TABLE reached the server: %s exists", e.scratch)
			}
		}},
		{"TRUNCATE", func(e *mariaEdge) string { return "/* cleanup */ TRUNCATE TABLE " + e.truncateable }, func(t *testing.T, e *mariaEdge) {
			if n := e.count(t, "SELECT COUNT(*) FROM "+e.truncateable); n != 3 {
				t.Errorf("the TRUNCATE reached the server: %d rows left of 3", n)
			}
		}},
		{"LOCK TABLES", func(e *mariaEdge) string { return "LOCK TABLES " + e.fx + " WRITE" }, func(*testing.T, *mariaEdge) {}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newMariaEdge(t, dsn)
			db, err := idempotent.OpenGuarded("mysql", dsn)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(2)
			t.Cleanup(func() { closeChecked(t, db) }) // runs first: a lock left on a session goes with it
			mw, err := idempotent.New(db, mysql.New(), "edges", idempotent.WithTable(e.table))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := mw.EnsureSchema(ctx); err != nil {
				t.Fatalf("EnsureSchema through GuardConnector: %v", err)
			}
			stmt := tc.stmt(e)
			var stmtErr error
			_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, func(ctx context.Context, tx *sql.Tx) error {
				if err := e.bump(ctx, tx); err != nil {
					return err
				}
				_, stmtErr = tx.ExecContext(ctx, stmt) // ignored, as careless code does
				return errors.New("pricing service failed after the DDL")
			})
			if !errors.Is(stmtErr, idempotent.ErrAutocommit) {
				t.Errorf("%s through the claim's transaction: %v, want ErrAutocommit before the server", tc.name, stmtErr)
			}
			if !errors.Is(err, idempotent.ErrAutocommit) || !strings.Contains(err.Error(), "commits implicitly") {
				t.Fatalf("Process = %v, want ErrAutocommit naming the implicit commit", err)
			}
			if c, n := e.claims(t), e.effect(t); c != 0 || n != 0 {
				t.Fatalf("after the failed delivery: %d claims, effect %d; want 0 and 0 (nothing committed)", c, n)
			}
			tc.check(t, e)
			for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
				got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, e.bump)
				if err != nil || got != want {
					t.Fatalf("redelivery %d = (%v, %v), want %v", i+1, got, err, want)
				}
			}
			if n := e.effect(t); n != 1 {
				t.Fatalf("effect %d after the redeliveries, want 1", n)
			}
		})
	}
}

// TestMariaDBStrictGuardSeesAnImplicitCommitOnTheErrorPath: without
// GuardConnector the DDL reaches MariaDB and commits the claim with half the
// effect. The strict guard cannot undo that, but the failure must say so,
// loudly, as ErrAutocommit, instead of passing for an ordinary handler error
// whose redelivery will silently be a Duplicate.
func TestMariaDBStrictGuardSeesAnImplicitCommitOnTheErrorPath(t *testing.T) {
	dsn := mysqlDSN(t)
	e := newMariaEdge(t, dsn)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	mw, err := idempotent.New(db, mysql.New(), "edges", idempotent.WithTable(e.table), idempotent.WithStrictGuard())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatalf("EnsureSchema with the strict guard on MariaDB: %v", err)
	}
	handlerErr := errors.New("pricing service failed after the DDL")
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := e.bump(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "CREATE TABLE "+e.scratch+" (id INT)"); err != nil {
			return err
		}
		return handlerErr
	})
	if !errors.Is(err, idempotent.ErrAutocommit) || !errors.Is(err, handlerErr) || !strings.Contains(err.Error(), "CLAIM COMMITTED WITHOUT ITS FULL EFFECT") {
		t.Fatalf("Process = %v, want ErrAutocommit saying the claim committed without its full effect, and the handler's error", err)
	}
	t.Logf("the error: %v", err)
	// What the error warns of: the claim and the first half are committed.
	if c, n := e.claims(t), e.effect(t); c != 1 || n != 1 {
		t.Fatalf("%d claims, effect %d: the implicit commit should have kept 1 and 1", c, n)
	}
}

// mysqlProper is the MySQL dialect as it meets MySQL proper, which has no
// @@in_transaction: its strict-guard query fails with error 1193, as
// MySQL's does.
type mysqlProper struct{ *mysql.Dialect }

func (mysqlProper) TxIDSQL() string { return "SELECT @@idempotent_no_such_variable" }

// TestStrictGuardOnAServerWithoutTransactionIDFailsInEnsureSchema: the
// strict guard on a server that cannot answer its query fails at
// EnsureSchema, not at every applied message.
func TestStrictGuardOnAServerWithoutTransactionIDFailsInEnsureSchema(t *testing.T) {
	dsn := mysqlDSN(t)
	e := newMariaEdge(t, dsn)
	mw, err := idempotent.New(e.admin, mysqlProper{mysql.New()}, "edges", idempotent.WithTable(e.table), idempotent.WithStrictGuard())
	if err != nil {
		t.Fatal(err)
	}
	err = mw.EnsureSchema(context.Background())
	if err == nil || !strings.Contains(err.Error(), "WithStrictGuard") || !strings.Contains(err.Error(), "1193") {
		t.Fatalf("EnsureSchema = %v, want an error naming WithStrictGuard and the server's 1193", err)
	}
	t.Logf("EnsureSchema: %v", err)
}

// TestFutureEventTimeIsRefused: an event time days ahead, or a seconds and
// milliseconds mix-up (year 58884), is refused in both modes before anything
// is written; after a Cleanup the replay cannot apply a second time.
func TestFutureEventTimeIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	daysAhead := now.Add(3 * 24 * time.Hour)
	msAsSeconds := time.Unix(now.UnixMilli(), 0) // the year 58884 or so
	msg := orderCompleted{OrderID: 4242, CustomerID: 12, TotalCents: 9900}
	for _, mode := range []string{"plain", "partitioned"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var l *loyalty
			var clock *testenv.Clock
			if mode == "plain" {
				l, clock = fenceFixture(t)
				clock.Set(now)
			} else {
				l, clock = partitionedLoyalty(t, now, 5)
			}
			ran := 0
			apply := func(ctx context.Context, tx *sql.Tx) error { ran++; return l.credit(ctx, tx, msg) }
			for _, at := range []time.Time{daysAhead, msAsSeconds} {
				got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply)
				if got != 0 || !errors.Is(err, idempotent.ErrInvalidEventTime) || errors.Is(err, idempotent.ErrBeyondRetention) {
					t.Fatalf("event at %v = (%v, %v), want ErrInvalidEventTime", at, got, err)
				}
				if !strings.Contains(err.Error(), at.UTC().Format(time.RFC3339)) || !strings.Contains(err.Error(), now.Format(time.RFC3339)) {
					t.Errorf("error does not show the event time and the clock: %v", err)
				}
				tx, err := l.db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, err = l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: msg.key(), EventTime: at})
				_ = tx.Rollback()
				if !errors.Is(err, idempotent.ErrInvalidEventTime) {
					t.Fatalf("ClaimMessage at %v: %v, want ErrInvalidEventTime", at, err)
				}
			}
			if ran != 0 || retCount(t, l.db, l.schema+".processed_messages", "") != 0 || l.balance(t, 12) != 0 {
				t.Fatalf("handler ran %d times, balance %d: want nothing written", ran, l.balance(t, 12))
			}
			// Inside the margin is fine.
			if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:skewed", EventTime: now.Add(idempotent.DefaultClockSkew - time.Second)}, func(context.Context, *sql.Tx) error { return nil }); got != idempotent.Applied || err != nil {
				t.Fatalf("event within the clock-skew margin = (%v, %v), want Applied", got, err)
			}
			if mode == "partitioned" {
				return
			}
			// A month on: Cleanup, then the message replayed with its
			// (then plausible) event time applies once in all.
			clock.Add(idempotent.DefaultRetention + idempotent.DefaultClockSkew + 24*time.Hour)
			if _, err := l.mw.ClaimTable().CleanupConsumer(ctx, l.mw.Config().Consumer, idempotent.DefaultCleanupOptions()); err != nil {
				t.Fatal(err)
			}
			if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: daysAhead}, apply); err != nil {
				t.Fatalf("replay a month on: %v", err)
			}
			if b := l.balance(t, 12); b != pointsFor(msg) || ran != 1 {
				t.Fatalf("balance %d after %d runs, want %d after 1: the future-dated message applied twice", b, ran, pointsFor(msg))
			}
		})
	}
}

// TestMissingPartitionInsideTheWindowIsTransient: a day inside the window
// whose partition was not created yet is ErrNoPartition, not
// ErrBeyondRetention, and applies once MaintainPartitions has run.
func TestMissingPartitionInsideTheWindowIsTransient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, clock := partitionedLoyalty(t, start, 1) // partitions up to 15 March
	clock.Add(2 * 24 * time.Hour)               // 16 March, no maintenance since
	msg := orderCompleted{OrderID: 316, CustomerID: 3, TotalCents: 1600}
	at := clock.Now().Add(-time.Hour)
	apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
	got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply)
	var pqErr *pq.Error
	if got != 0 || !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) || !errors.As(err, &pqErr) {
		t.Fatalf("event on a day without its partition yet = (%v, %v), want ErrNoPartition (not ErrBeyondRetention)", got, err)
	}
	if !strings.Contains(err.Error(), "2031-03-16") {
		t.Errorf("error does not name the day: %v", err)
	}
	if _, err := l.mw.ClaimTable().MaintainPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply); got != idempotent.Applied || err != nil {
		t.Fatalf("once the partition exists = (%v, %v), want Applied", got, err)
	}
	if b := l.balance(t, 3); b != pointsFor(msg) {
		t.Fatalf("balance %d, want %d", b, pointsFor(msg))
	}
}

// refusedLevels are the isolation levels no dialect here can run.
var refusedLevels = []sql.IsolationLevel{sql.LevelSnapshot, sql.LevelLinearizable, sql.LevelWriteCommitted}

// checkLevelsRefused checks that New refuses each level in refused with an
// error naming the level and the dialect, and ReadOnly.
func checkLevelsRefused(t *testing.T, db *sql.DB, d dialect.Dialect, refused []sql.IsolationLevel) {
	t.Helper()
	for _, l := range refused {
		_, err := idempotent.New(db, d, "edges", idempotent.WithTxOptions(sql.TxOptions{Isolation: l}))
		if err == nil || !strings.Contains(err.Error(), l.String()) || !strings.Contains(err.Error(), d.Name()) {
			t.Errorf("%s: New with %v = %v, want an error naming the level and the dialect", d.Name(), l, err)
		}
	}
	if _, err := idempotent.New(db, d, "edges", idempotent.WithTxOptions(sql.TxOptions{ReadOnly: true})); err == nil {
		t.Errorf("%s: New with ReadOnly succeeded", d.Name())
	}
}

// checkLevelsRun checks that every level New accepts really runs a claim.
func checkLevelsRun(t *testing.T, db *sql.DB, d dialect.Dialect, table string, levels []sql.IsolationLevel) {
	t.Helper()
	ctx := context.Background()
	for _, l := range levels {
		mw, err := idempotent.New(db, d, "edges", idempotent.WithTable(table), idempotent.WithTxOptions(sql.TxOptions{Isolation: l}))
		if err != nil {
			t.Fatalf("%s: New with %v: %v", d.Name(), l, err)
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "level-" + l.String()}, func(context.Context, *sql.Tx) error { return nil }); got != idempotent.Applied || err != nil {
			t.Errorf("%s: Process under %v = (%v, %v)", d.Name(), l, got, err)
		}
	}
}

var acceptedLevels = []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// TestNewRefusesIsolationLevelsTheDialectCannotRun: with lib/pq and pgx, with
// and without GuardConnector, on MariaDB and on SQLite.
func TestNewRefusesIsolationLevelsTheDialectCannotRun(t *testing.T) {
	for _, drv := range drivers {
		for _, guarded := range []bool{false, true} {
			t.Run(fmt.Sprintf("postgres/%s/guarded=%v", drv, guarded), func(t *testing.T) {
				t.Parallel()
				var db *sql.DB
				if guarded {
					db = openGuarded(t, drv, 4)
				} else {
					if pgDSN == "" {
						t.Skip(skipReason)
					}
					db = sql.OpenDB(connector(t, drv, pgDSN))
					t.Cleanup(func() { closeChecked(t, db) })
				}
				checkLevelsRefused(t, db, postgres.New(), refusedLevels)
				if drv == "pq" {
					// Why: lib/pq itself refuses them at every BeginTx.
					for _, l := range refusedLevels {
						if tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: l}); err == nil {
							_ = tx.Rollback()
							t.Errorf("lib/pq began a %v transaction", l)
						}
					}
				}
				checkLevelsRun(t, db, postgres.New(), tempSchema(t, db)+".claims", acceptedLevels)
			})
		}
	}
	t.Run("mysql", func(t *testing.T) {
		dsn := mysqlDSN(t)
		e := newMariaEdge(t, dsn)
		checkLevelsRefused(t, e.admin, mysql.New(), refusedLevels)
		checkLevelsRun(t, e.admin, mysql.New(), e.table, acceptedLevels)
	})
	t.Run("sqlite", func(t *testing.T) {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "levels.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeChecked(t, db) })
		checkLevelsRefused(t, db, sqlite.New(), append([]sql.IsolationLevel{sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead}, refusedLevels...))
		checkLevelsRun(t, db, sqlite.New(), "claims", []sql.IsolationLevel{sql.LevelDefault, sql.LevelSerializable})
	})
}
