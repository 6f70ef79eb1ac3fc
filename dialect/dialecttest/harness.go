package dialecttest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// Harness is what a dialect's test gives [Run].
type Harness struct {
	// Dialect is the dialect under test. Required.
	Dialect dialect.Dialect

	// Open returns a new *sql.DB on the database under test. Every call
	// must reach the same database. The suite caps the pool at MaxConns,
	// and closes it at the end of the test that opened it, failing that
	// test if a connection is still in use. Required.
	Open func(t testing.TB) (*sql.DB, error)

	// Table returns a fresh claim-table name, "table" or "schema.table", of
	// lower-case ASCII letters, digits and underscores, that no other test
	// uses. The suite also creates helper tables named after it with a
	// suffix ("<table>_fx"), and drops every table it creates; Table may
	// use t.Cleanup to drop what it created itself (a schema, say). db is
	// a *sql.DB from Open. Required.
	Table func(t testing.TB, db *sql.DB) string

	// MaxConns caps every pool the suite opens. The concurrency checks run
	// up to 32 deliveries at once; with fewer connections they queue for
	// one, which still checks the outcome but less of the overlap. Default
	// is 34.
	MaxConns int

	// SerialWriters says the database runs one writing transaction at a
	// time, as SQLite does: a concurrent delivery waits at BEGIN rather
	// than at the claim, and no two transactions can deadlock, so the
	// deadlock check is replaced by the harness's Provokers.
	SerialWriters bool

	// KillSession, if set, ends the database session that runs tx from
	// outside, as an administrator would (pg_terminate_backend, KILL), and
	// returns once it is gone. The suite uses it to check that a delivery
	// whose connection is lost is retried and applied exactly once.
	KillSession func(t testing.TB, tx *sql.Tx, admin *sql.DB)

	// Provokers make the database fail with real errors of a known kind,
	// for the dialect to classify. At least one provoker, or the suite's
	// own deadlock (when SerialWriters is false), must yield a retryable
	// error.
	Provokers []Provoker

	// Skip names checks that do not apply to the dialect, each with the
	// reason, which the suite logs. A name is a subtest path below Run's
	// test, such as "MissingTable". Naming a check that does not exist
	// fails the suite.
	Skip map[string]string

	// Extra runs more checks after the suite's own, as subtests of Run's
	// test with the given names: checks particular to the dialect.
	Extra map[string]func(t *testing.T, e *Env)

	// OpenGuarded returns a new *sql.DB on the same database as Open, with
	// its connections wrapped by idempotent.GuardConnector (for instance
	// with idempotent.OpenGuarded). Required when the dialect implements
	// dialect.ImplicitCommitter: the ImplicitCommit check sends DDL through
	// the claim's transaction and expects the guard to refuse it.
	OpenGuarded func(t testing.TB) (*sql.DB, error)

	// ProcessedAt returns a SQL expression for a claim's processed_at at t
	// (UTC, a whole millisecond), as the dialect's claim table stores it:
	// "'2031-02-01 12:00:00.123'" (MySQL, SQLite) or
	// "'2031-02-01 12:00:00.123Z'::timestamptz" (Postgres). Required when
	// the dialect implements dialect.Cleaner or dialect.StatsReader: the
	// retention checks insert claims of known ages with it.
	ProcessedAt func(t time.Time) string

	// LockTimeoutQuery is a query yielding the session's current lock
	// timeout as one value, such as "SHOW lock_timeout" (Postgres) or
	// "SELECT @@SESSION.innodb_lock_wait_timeout" (MySQL). Required when
	// the dialect can bound lock waits: the LockTimeoutRestored checks
	// compare it on one session before and after a claim.
	LockTimeoutQuery string

	// LateDeadlockCheck, if set, is a statement that makes the
	// transaction it runs in look for deadlocks only long after the
	// others do (Postgres: SET LOCAL deadlock_timeout = '1min'). The
	// matrix's deadlock cells run it in the transaction they set against a
	// handler, so that the handler's transaction finds the deadlock and is
	// its victim, on a database where the first to look is the victim.
	// Where the database picks the lighter transaction (InnoDB), the cells
	// make the other one heavier and need no statement.
	LateDeadlockCheck string

	// Concurrent is how many cells of the matrix run at a time. A cell
	// waits on the database far more than on the CPU, and opens up to
	// about ten connections. Default is 4.
	Concurrent int
}

// Provoker makes the database under test fail with a real error that the
// dialect must classify as Want.
type Provoker struct {
	// Name names the subtest, such as "busy".
	Name string
	// Want is the kind Classify must return.
	Want dialect.Kind
	// Provoke returns the error the database produced. table is a fresh
	// name the provoker may create and must drop.
	Provoke func(t testing.TB, db *sql.DB, table string) error
}

// Env gives checks (the suite's own and a Harness's Extra) the harness's
// database with the suite's pool limit and leak check.
type Env struct {
	h Harness
}

// Harness returns the harness the suite runs with.
func (e *Env) Harness() Harness { return e.h }

// Dialect returns the dialect under test.
func (e *Env) Dialect() dialect.Dialect { return e.h.Dialect }

// DB opens a database with the harness's Open, capped at MaxConns
// connections, and closes it when t ends, failing t if a connection is
// still in use.
func (e *Env) DB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := e.h.Open(t)
	if err != nil {
		t.Fatalf("open the database under test: %v", err)
	}
	db.SetMaxOpenConns(e.h.MaxConns)
	db.SetMaxIdleConns(4)
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
		_ = db.Close()
	})
	return db
}

// Table returns a fresh claim-table name from the harness, and drops the
// table (if anything created it) when t ends.
func (e *Env) Table(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := e.h.Table(t, db)
	tab, err := dialect.ParseTable(name)
	if err != nil || strings.ToLower(name) != name {
		t.Fatalf("Harness.Table returned %q: want a lower-case table or schema.table name (%v)", name, err)
	}
	dropAtEnd(t, db, name)
	if h, ok := e.h.Dialect.(dialect.HorizonKeeper); ok {
		// EnsureSchema creates it beside the claim table.
		dropAtEnd(t, db, h.HorizonTable(tab).String())
	}
	if o, ok := e.h.Dialect.(dialect.Orderer); ok {
		// EnsureSchema creates them WithOrdering.
		seq, parked := o.OrderTables(tab)
		dropAtEnd(t, db, seq.String())
		dropAtEnd(t, db, parked.String())
	}
	return name
}

// dropAtEnd drops table when t ends. The name is a plain lower-case
// identifier, the same unquoted in every dialect.
func dropAtEnd(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	t.Cleanup(func() {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
}

// Middleware returns a middleware for consumer on table, with the schema
// ensured.
func (e *Env) Middleware(t testing.TB, db *sql.DB, table, consumer string, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	opts = append([]idempotent.Option{idempotent.WithTable(table)}, opts...)
	mw, err := idempotent.New(db, e.h.Dialect, consumer, opts...)
	if err != nil {
		t.Fatalf("idempotent.New: %v", err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatalf("EnsureSchema: %v", err)
	}
	return mw
}

// Effects is a helper table of counters that handlers bump inside the
// claim's transaction: the effect whose count the checks compare.
type Effects struct {
	db   *sql.DB
	name string
}

// NewEffects creates the counter table "<table>_fx" with rows 1 to n at 0,
// dropped when t ends.
func (e *Env) NewEffects(t testing.TB, db *sql.DB, table string, n int) *Effects {
	t.Helper()
	name := table + "_fx"
	dropAtEnd(t, db, name)
	if _, err := db.Exec("CREATE TABLE " + name + " (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	rows := make([]string, n)
	for i := range rows {
		rows[i] = fmt.Sprintf("(%d, 0)", i+1)
	}
	if _, err := db.Exec("INSERT INTO " + name + " (id, n) VALUES " + strings.Join(rows, ", ")); err != nil {
		t.Fatalf("fill %s: %v", name, err)
	}
	return &Effects{db: db, name: name}
}

// Bump adds one to counter id through tx.
func (f *Effects) Bump(ctx context.Context, tx *sql.Tx, id int) error {
	_, err := tx.ExecContext(ctx, f.BumpSQL(id))
	return err
}

// BumpSQL is the statement that adds one to counter id.
func (f *Effects) BumpSQL(id int) string {
	return fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = %d", f.name, id)
}

// Name is the counter table's name.
func (f *Effects) Name() string { return f.name }

// Get returns counter id.
func (f *Effects) Get(t testing.TB, id int) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(fmt.Sprintf("SELECT n FROM %s WHERE id = %d", f.name, id)).Scan(&n); err != nil {
		t.Fatalf("read %s: %v", f.name, err)
	}
	return n
}

// Claims returns the message keys in the claim table, for all consumers,
// as the database returns them.
func (e *Env) Claims(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query("SELECT message_key FROM " + table + " ORDER BY consumer, message_key")
	if err != nil {
		t.Fatalf("read claims: %v", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			t.Fatalf("read claims: %v", err)
		}
		keys = append(keys, string(k))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read claims: %v", err)
	}
	return keys
}
