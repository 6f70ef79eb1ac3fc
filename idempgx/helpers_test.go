package idempgx_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
)

// dsn returns the test database: IDEMPOTENT_POSTGRES_DSN, or the local
// server. Tests skip when neither answers, unless CI is set.
func dsn(t testing.TB) string {
	t.Helper()
	d := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d)
	if err != nil {
		testenv.Unavailable(t, "no database at %s: %v", d, err)
	}
	_ = c.Close(ctx)
	return d
}

// newPool opens a pool of at most maxConns connections, closed in Cleanup.
func newPool(t testing.TB, maxConns int32, options ...string) *pgxpool.Pool {
	t.Helper()
	return newPoolAt(t, dsn(t), maxConns, options...)
}

// newPoolAt is newPool on the database at d.
func newPoolAt(t testing.TB, d string, maxConns int32, options ...string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withOptions(d, options...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// tempSchema creates a schema of the test's own, dropped in Cleanup.
func tempSchema(t testing.TB, p *pgxpool.Pool) string {
	t.Helper()
	name := testenv.UniqueName("t")
	exec(t, p, "CREATE SCHEMA "+name)
	t.Cleanup(func() {
		if _, err := p.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

func exec(t testing.TB, p *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := p.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t testing.TB, p *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := p.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// setup returns a pool, a schema with the claim table and an effects
// table (id text primary key, n int), and a Middleware on it.
func setup(t testing.TB, maxConns int32, opts ...idempgx.Option) (*pgxpool.Pool, string, *idempgx.Middleware) {
	t.Helper()
	p := newPool(t, maxConns)
	s := tempSchema(t, p)
	exec(t, p, "CREATE TABLE "+s+".effects (id text PRIMARY KEY, n int NOT NULL DEFAULT 1)")
	m, err := idempgx.New(p, "orders", append([]idempgx.Option{idempgx.WithTable(s + ".claims")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p, s, m
}

// waitFor polls cond until it holds, failing the test after 30 seconds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// withOptions adds server settings given as URL parameters, such as
// "synchronous_commit=off", to a URL DSN; pgx sends them as run-time
// parameters of each connection.
func withOptions(dsn string, options ...string) string {
	o := strings.Join(options, "&")
	if o == "" {
		return dsn
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + o
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
