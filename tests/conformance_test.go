package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/dialect/dialecttest"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// The conformance suite, run by every dialect against its real database.

func TestConformancePostgres(t *testing.T) {
	dialecttest.Run(t, pgHarness(t, "pq"))
}

// TestConformancePostgresPgx is the suite through pgx's database/sql driver
// (github.com/jackc/pgx/v5/stdlib).
func TestConformancePostgresPgx(t *testing.T) {
	dialecttest.Run(t, pgHarness(t, "pgx"))
}

// pgHarness is the Postgres harness with the named database/sql driver
// ("pq" or "pgx").
func pgHarness(t *testing.T, drv string) dialecttest.Harness {
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	return dialecttest.Harness{
		Dialect: postgres.New(),
		Open:    func(t testing.TB) (*sql.DB, error) { return sql.OpenDB(connector(t, drv, pgDSN)), nil },
		Table: func(t testing.TB, db *sql.DB) string {
			return tempSchema(t, db) + ".claims"
		},
		// The server is shared (max_connections 100): 32 deliveries queue
		// for 16 connections.
		MaxConns:          16,
		KillSession:       killPostgres,
		LateDeadlockCheck: "SET LOCAL deadlock_timeout = '1min'",
		LockTimeoutQuery:  "SHOW lock_timeout",
		ProcessedAt: func(t time.Time) string {
			return "'" + t.UTC().Format("2006-01-02 15:04:05.000Z") + "'::timestamptz"
		},
		OpenGuarded: func(t testing.TB) (*sql.DB, error) {
			return sql.OpenDB(idempotent.GuardConnector(connector(t, drv, pgDSN))), nil
		},
		Provokers: []dialecttest.Provoker{
			{Name: "serialization failure", Want: dialect.KindSerialization, Provoke: pgWriteSkew},
			{Name: "lock not available", Want: dialect.KindLockTimeout, Provoke: pgNoWait},
			{Name: "undefined table", Want: dialect.KindUndefinedTable, Provoke: missingTableInsert("$1")},
		},
	}
}

func TestConformanceMySQL(t *testing.T) {
	dsn := mysqlDSN(t)
	dialecttest.Run(t, dialecttest.Harness{
		Dialect:          mysql.New(),
		Open:             func(testing.TB) (*sql.DB, error) { return sql.Open("mysql", dsn) },
		Table:            func(testing.TB, *sql.DB) string { return uniqueName("t") },
		MaxConns:         34,
		KillSession:      killMySQL,
		LockTimeoutQuery: "SELECT @@SESSION.innodb_lock_wait_timeout",
		ProcessedAt:      mysqlProcessedAt,
		OpenGuarded:      func(testing.TB) (*sql.DB, error) { return idempotent.OpenGuarded("mysql", dsn) },
		Provokers: []dialecttest.Provoker{
			{Name: "lock wait timeout", Want: dialect.KindLockTimeout, Provoke: mysqlLockWait},
			{Name: "undefined table", Want: dialect.KindUndefinedTable, Provoke: missingTableInsert("?")},
		},
		Extra: map[string]func(*testing.T, *dialecttest.Env){
			"MySQL/ClientFoundRows":     func(t *testing.T, e *dialecttest.Env) { mysqlClientFoundRows(t, e, dsn) },
			"MySQL/LockTimeoutRestored": func(t *testing.T, e *dialecttest.Env) { mysqlLockTimeoutRestored(t, e, dsn) },
			"MySQL/InnoDBRequired":      mysqlInnoDBRequired,
			"MySQL/NoDatabaseSelected":  func(t *testing.T, e *dialecttest.Env) { mysqlNoDatabase(t, e, dsn) },
			// The retention statements (mysql_retention_test.go).
			"MySQL/Retention/CleanupLockNamesTheTable":       mysqlCleanupLockNamesTheTable,
			"MySQL/Retention/CleanupBatchTimesOut":           mysqlCleanupBatchTimesOut,
			"MySQL/Retention/CleanupUsesTheProcessedAtIndex": mysqlCleanupUsesTheProcessedAtIndex,
			"MySQL/Retention/MaintenanceLock":                mysqlMaintenanceLock,
			"MySQL/Retention/PartitionDDLWaitIsBounded":      mysqlPartitionDDLWaitIsBounded,
		},
	})
}

func TestConformanceSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conformance.db")
	dialecttest.Run(t, dialecttest.Harness{
		Dialect:       sqlite.New(),
		Open:          func(testing.TB) (*sql.DB, error) { return sqlite.Open(path) },
		Table:         func(testing.TB, *sql.DB) string { return uniqueName("t") },
		MaxConns:      34,
		SerialWriters: true,
		ProcessedAt:   sqliteProcessedAt,
		OpenGuarded: func(testing.TB) (*sql.DB, error) {
			dsn, err := sqlite.DSN(path)
			if err != nil {
				return nil, err
			}
			return idempotent.OpenGuarded(sqlite.DriverName, dsn)
		},
		Provokers: []dialecttest.Provoker{
			{Name: "busy", Want: dialect.KindSerialization, Provoke: sqliteBusy},
			{Name: "busy snapshot", Want: dialect.KindSerialization, Provoke: func(t testing.TB, _ *sql.DB, table string) error {
				return sqliteBusySnapshot(t, path, table)
			}},
			{Name: "locked", Want: dialect.KindSerialization, Provoke: sqliteLocked},
		},
		Skip: map[string]string{
			"MissingTable": `SQLite reports a missing table as a plain SQLITE_ERROR, told apart from other errors only by its message; Process fails with the driver's "no such table" error instead of ErrNoClaimTable`,
		},
	})
}

// mysqlProcessedAt writes t as the MySQL claim table stores processed_at:
// a DATETIME(6) in UTC.
func mysqlProcessedAt(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.000000") + "'"
}

// sqliteProcessedAt writes t as the SQLite claim table stores processed_at:
// UTC text with milliseconds.
func sqliteProcessedAt(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.000") + "'"
}

// mysqlDSN returns the MariaDB/MySQL DSN from IDEMPOTENT_MYSQL_DSN, or the
// local default. It skips the test if the server does not answer, or fails
// it when CI is set.
func mysqlDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("IDEMPOTENT_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	db, err := sql.Open("mysql", dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		_ = db.Close()
	}
	if err != nil {
		msg := fmt.Sprintf("no MySQL/MariaDB at %q: %v (set IDEMPOTENT_MYSQL_DSN, for example root@tcp(127.0.0.1:3306)/test)", dsn, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dsn
}

// missingTableInsert provokes an undefined-table error; ph is the
// dialect's first placeholder.
func missingTableInsert(ph string) func(testing.TB, *sql.DB, string) error {
	return func(_ testing.TB, db *sql.DB, table string) error {
		_, err := db.Exec("INSERT INTO "+table+"_missing (consumer) VALUES ("+ph+")", "x")
		return err
	}
}

// waitGone polls until a query counting the victim's session returns 0.
func waitGone(t testing.TB, admin *sql.DB, query string, id int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(query, id).Scan(&n); err != nil {
			t.Fatalf("wait for session %d to end: %v", id, err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %d still there after 30s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func killPostgres(t testing.TB, tx *sql.Tx, admin *sql.DB) {
	t.Helper()
	var pid int64
	if err := tx.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	testenv.TerminatePostgres(t, admin, pid)
}

func killMySQL(t testing.TB, tx *sql.Tx, admin *sql.DB) {
	t.Helper()
	var id int64
	if err := tx.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatal(err)
	}
	waitGone(t, admin, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id)
}

// pgWriteSkew provokes a real 40001: two serializable transactions each
// read what the other writes.
func pgWriteSkew(t testing.TB, db *sql.DB, table string) error {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE " + table + " (id int PRIMARY KEY, on_call bool NOT NULL); INSERT INTO " + table + " VALUES (1, true), (2, true)"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := &sql.TxOptions{Isolation: sql.LevelSerializable}
	a, err := db.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback()
	b, err := db.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Rollback()
	var n int
	for _, tx := range []*sql.Tx{a, b} {
		if err := tx.QueryRow("SELECT count(*) FROM " + table + " WHERE on_call").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Exec("UPDATE " + table + " SET on_call = false WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec("UPDATE " + table + " SET on_call = false WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(); err != nil {
		return err
	}
	return b.Commit()
}

// pgNoWait provokes a real 55P03: a row lock that cannot be had at once.
func pgNoWait(t testing.TB, db *sql.DB, table string) error {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE " + table + " (id int PRIMARY KEY); INSERT INTO " + table + " VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec("SELECT id FROM " + table + " WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec("SELECT id FROM " + table + " WHERE id = 1 FOR UPDATE NOWAIT")
	return err
}

// mysqlLockWait provokes a real 1205 on a session whose
// innodb_lock_wait_timeout is 1s.
func mysqlLockWait(t testing.TB, db *sql.DB, table string) error {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE " + table + " (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec("INSERT INTO " + table + " VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer c.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT") //nolint:errcheck
	if _, err := c.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	_, err = c.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)")
	return err
}

// sqliteBusy provokes a real SQLITE_BUSY: a write on a connection that will
// not wait while another transaction holds the write lock.
func sqliteBusy(t testing.TB, db *sql.DB, table string) error {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE " + table + " (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Begin() // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	defer c.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", sqlite.BusyTimeout.Milliseconds())) //nolint:errcheck
	_, err = c.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)")
	return err
}

// sqliteBusySnapshot provokes a real SQLITE_BUSY_SNAPSHOT: a deferred
// transaction (as without _txlock=immediate) writing after another
// connection committed since it read.
func sqliteBusySnapshot(t testing.TB, path, table string) error {
	t.Helper()
	db, err := sql.Open(sqlite.DriverName, "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE " + table + " (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO " + table + " VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec("INSERT INTO " + table + " VALUES (2)")
	return err
}

// sqliteLocked provokes a real SQLITE_LOCKED: dropping a table that an open
// cursor on the same connection still reads.
func sqliteLocked(t testing.TB, db *sql.DB, table string) error {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE " + table + " (id INTEGER PRIMARY KEY); INSERT INTO " + table + " VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rows, err := c.QueryContext(ctx, "SELECT id FROM "+table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		t.Fatal("no row")
	}
	_, err = c.ExecContext(ctx, "DROP TABLE "+table)
	return err
}
