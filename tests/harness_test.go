package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// drivers are the database/sql drivers every driver-sensitive test runs with.
var drivers = []string{"pq", "pgx"}

// connector returns a driver connector for dsn through the named driver.
func connector(t testing.TB, drv, dsn string) driver.Connector {
	t.Helper()
	switch drv {
	case "pq":
		c, err := pq.NewConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	case "pgx":
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return stdlib.GetConnector(*cfg)
	}
	t.Fatalf("unknown driver %q", drv)
	return nil
}

// openGuarded opens the test database through GuardConnector with the named
// driver and at most maxConns connections. It is closed in Cleanup after a
// leak check.
func openGuarded(t testing.TB, drv string, maxConns int) *sql.DB {
	t.Helper()
	return openGuardedDSN(t, drv, "", maxConns)
}

// openGuardedDSN is openGuarded on another DSN ("" for the test database).
func openGuardedDSN(t testing.TB, drv, dsn string, maxConns int) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	if dsn == "" {
		dsn = routedDSN(t, drv)
	}
	db := sql.OpenDB(idempotent.GuardConnector(connector(t, drv, dsn)))
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// openMonitor opens a small plain lib/pq pool for the test's own bookkeeping
// (polling pg_stat_activity, killing backends, counting rows).
// It connects straight to the test database even when the test's own
// connections are routed through a pooler (see routeTests).
func openMonitor(t testing.TB) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	db, err := sql.Open("postgres", pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	db.SetMaxOpenConns(3)
	return db
}

// heavyMu serialises the tests that open many connections at once, so that
// the package as a whole stays well inside the shared server's limit.
var heavyMu sync.Mutex

func heavy(t testing.TB) {
	t.Helper()
	heavyMu.Lock()
	t.Cleanup(heavyMu.Unlock)
}

// waitFor polls cond until it reports true, failing the test after 15s.
func waitFor(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitLockWaiters waits until at least n backends are waiting on a lock
// while running a statement that mentions marker (a schema name).
func waitLockWaiters(t testing.TB, mon *sql.DB, marker string, n int) {
	t.Helper()
	waitFor(t, "lock waiters", func() (bool, error) {
		var got int
		err := mon.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, marker).Scan(&got)
		return got >= n, err
	})
}

// waitPIDWaiting waits until the backend pid waits on a lock.
func waitPIDWaiting(t testing.TB, mon *sql.DB, pid int) {
	t.Helper()
	waitFor(t, "backend to wait on a lock", func() (bool, error) {
		var n int
		err := mon.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE pid = $1 AND wait_event_type = 'Lock'`, pid).Scan(&n)
		return n == 1, err
	})
}

// terminate kills the backend pid and waits for it to exit.
func terminate(t testing.TB, mon *sql.DB, pid int) {
	t.Helper()
	var ok bool
	if err := mon.QueryRow("SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil {
		t.Fatalf("terminate backend %d: %v", pid, err)
	}
	if !ok {
		t.Fatalf("backend %d did not terminate", pid)
	}
}

// backendPID returns the pid of the backend running tx.
func backendPID(ctx context.Context, tx *sql.Tx) (int, error) {
	var pid int
	err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	return pid, err
}

// count returns the result of a count(*) query.
func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// claims returns how many claims the table holds for consumer and key.
func claims(t testing.TB, db *sql.DB, table, consumer, key string) int {
	t.Helper()
	return count(t, db, "SELECT count(*) FROM "+quoteTable(table)+" WHERE consumer = $1 AND message_key = $2", consumer, key)
}

// quoteTable quotes "schema.table".
func quoteTable(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = pq.QuoteIdentifier(p)
	}
	return strings.Join(parts, ".")
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu       sync.Mutex
	outcomes []idempotent.Event
	retries  []idempotent.RetryEvent
}

func (r *recorder) Outcome(_ context.Context, e idempotent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes = append(r.outcomes, e)
}

func (r *recorder) Retry(_ context.Context, e idempotent.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries = append(r.retries, e)
}

// retryCodes returns the SQLSTATE (or "" for a transport failure) of each
// retry, in order.
func (r *recorder) retryCodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var codes []string
	for _, e := range r.retries {
		codes = append(codes, e.Code)
	}
	return codes
}

func (r *recorder) retryReasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs []string
	for _, e := range r.retries {
		rs = append(rs, e.Reason)
	}
	return rs
}

// sqlState returns the SQLSTATE carried by err, or "".
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// dsnWithHost returns dsn (a URL) pointing at addr instead of its host.
func dsnWithHost(t testing.TB, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		t.Skipf("DSN %q is not a URL; the proxy tests need postgres://host:port/…", dsn)
	}
	u.Host = addr
	return u.String()
}

// dsnHost returns the host:port of a URL DSN.
func dsnHost(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		t.Skipf("DSN %q is not a URL; the proxy tests need postgres://host:port/…", dsn)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5432"
	}
	return host
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}

// options returns table options as the Options New takes.
func options(ts ...idempotent.TableOption) []idempotent.Option {
	opts := make([]idempotent.Option, len(ts))
	for i, o := range ts {
		opts[i] = o
	}
	return opts
}
