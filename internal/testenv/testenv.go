// Package testenv is what the integration tests of every module share to
// reach the servers they run against: environment variables with defaults,
// a skip that becomes a failure under CI, names unique to a test, and a
// pool on the test Postgres.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // the "postgres" driver of OpenPostgres
)

// DefaultPostgresDSN is the test database when IDEMPOTENT_POSTGRES_DSN is
// not set.
const DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Getenv returns the environment variable name, or def when it is unset or
// empty.
func Getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Unavailable skips the test because a server or binary it needs is not
// there — or fails it when the CI environment variable is set, where every
// server must be.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// UniqueName returns prefix and 12 random hex digits joined by an
// underscore: a name for a schema, stream or queue of the test's own.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// OpenPostgres returns a pool of at most maxConns connections (lib/pq) on
// IDEMPOTENT_POSTGRES_DSN, or DefaultPostgresDSN, closed in Cleanup. It
// calls Unavailable when the server does not answer within 5 seconds.
func OpenPostgres(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	dsn := Getenv("IDEMPOTENT_POSTGRES_DSN", DefaultPostgresDSN)
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		Unavailable(t, "no Postgres at IDEMPOTENT_POSTGRES_DSN (%s): %v", dsn, err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Clock is a clock a test moves, for idempotent.WithClock: the real time
// until Set, then the time it was set to, moved by Add. It is safe for
// concurrent use.
type Clock struct {
	mu sync.Mutex
	at time.Time
}

// NewClock returns a Clock set to at (the real time when at is zero).
func NewClock(at time.Time) *Clock { return &Clock{at: at} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return time.Now()
	}
	return c.at
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = t
}

// Add moves the clock by d (from the real time, if it was never set).
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		c.at = time.Now()
	}
	c.at = c.at.Add(d)
}

// TerminatePostgres ends the Postgres backend pid (pg_terminate_backend)
// and returns once it is gone.
func TerminatePostgres(t testing.TB, admin *sql.DB, pid int64) {
	t.Helper()
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatalf("terminate backend %d: %v", pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatalf("wait for backend %d to end: %v", pid, err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still there after 30s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
