package idemhttp_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// backend is one database the tests run on: a pool, a claim table and an
// effects table of the test's own.
type backend struct {
	name string
	// db is the pool the tests read the effects with; on "pgx" it is a
	// lib/pq pool beside the pgx one the middleware runs on.
	db *sql.DB
	// pool, on "pgx" only, is the pgxpool of the idempgx.Middleware, whose
	// handlers get a pgx.Tx from pgxhttp.TxFromContext.
	pool    *pgxpool.Pool
	dollar  bool // $n placeholders
	d       dialect.Dialect
	claims  string // claim table, as given to WithTable
	effects string // the handler's table: one row per applied request
	// busy is whether a concurrent duplicate is answered 409 (a dialect
	// with a lock timeout) rather than waiting for the first to finish.
	busy  bool
	clock *testenv.Clock
	// observer, when set, hears of the claims of the middleware's
	// Middleware (idempotent or idempgx).
	observer idempotent.Observer
}

// bind turns ? placeholders into $n for Postgres.
func (b *backend) bind(q string) string {
	if !b.dollar {
		return q
	}
	var s strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			s.WriteString("$" + strconv.Itoa(n))
			continue
		}
		s.WriteRune(c)
	}
	return s.String()
}

// count returns the effects rows of key (all of them when key is "").
func (b *backend) count(t testing.TB, key string) int {
	t.Helper()
	var n int
	q, args := "SELECT count(*) FROM "+b.effects, []any{}
	if key != "" {
		q, args = q+" WHERE k = ?", []any{key}
	}
	if err := b.db.QueryRow(b.bind(q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// errNoTx is execTx's error for a request the middleware is not running.
var errNoTx = errors.New("no claim transaction")

// execTx runs q in the claim's transaction of the request whose context is
// ctx, as a handler of the backend does: through idemhttp.TxFromContext's
// *sql.Tx, or on "pgx" through pgxhttp.TxFromContext's pgx.Tx (and then
// idemhttp.TxFromContext must give nil).
func (b *backend) execTx(ctx context.Context, q string, args ...any) error {
	q = b.bind(q)
	if b.pool != nil {
		tx := pgxhttp.TxFromContext(ctx)
		if tx == nil {
			return errNoTx
		}
		if idemhttp.TxFromContext(ctx) != nil {
			return errors.New("idemhttp.TxFromContext gave a *sql.Tx to a pgx handler")
		}
		_, err := tx.Exec(ctx, q, args...)
		return err
	}
	tx := idemhttp.TxFromContext(ctx)
	if tx == nil {
		return errNoTx
	}
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

// middleware returns the idempotent.Middleware of the backend (its schema
// ensured) and the HTTP middleware on it. On "pgx" the HTTP middleware is
// pgxhttp's on an idempgx.Middleware, and the idempotent.Middleware is that
// one's Core.
func (b *backend) middleware(t testing.TB, scope idemhttp.ScopeFunc, opts ...idemhttp.Option) (*idempotent.Middleware, *idemhttp.Middleware) {
	t.Helper()
	ctx := context.Background()
	var (
		mw  *idempotent.Middleware
		h   *idemhttp.Middleware
		err error
	)
	if b.pool != nil {
		var m *idempgx.Middleware
		o := []idempgx.Option{idempgx.WithTable(b.claims), idempgx.WithClock(b.clock.Now), idempgx.WithLockTimeout(100 * time.Millisecond)}
		if b.observer != nil {
			o = append(o, idempgx.WithObserver(b.observer))
		}
		m, err = idempgx.New(b.pool, "orders-api", o...)
		if err != nil {
			t.Fatal(err)
		}
		mw = m.Core()
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		h, err = pgxhttp.New(m, scope, opts...)
	} else {
		o := []idempotent.Option{idempotent.WithTable(b.claims), idempotent.WithClock(b.clock.Now)}
		if b.busy {
			o = append(o, idempotent.WithLockTimeout(100*time.Millisecond))
		}
		if b.observer != nil {
			o = append(o, idempotent.WithObserver(b.observer))
		}
		mw, err = idempotent.New(b.db, b.d, "orders-api", o...)
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		h, err = idemhttp.New(mw, scope, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := h.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	return mw, h
}

// backends are the databases eachBackend runs on: Postgres through lib/pq,
// through pgx (pgxhttp on idempgx, handlers with a pgx.Tx) and through
// pgx's database/sql driver (idemhttp.New, handlers with a *sql.Tx),
// MariaDB, and SQLite.
var backends = []string{"postgres", "pgx", "pgxstdlib", "mysql", "sqlite"}

// eachBackend runs f on every database, each in a subtest with tables of
// its own.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			f(t, openBackend(t, name))
		})
	}
}

func openBackend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name, clock: testenv.NewClock(time.Time{})}
	switch name {
	case "postgres", "pgx", "pgxstdlib":
		b.db, b.d, b.busy, b.dollar = testenv.OpenPostgres(t, 40), postgres.New(), true, true
		dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
		switch name {
		case "pgx":
			cfg, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 40
			if b.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.pool.Close)
		case "pgxstdlib":
			// The existing constructor, idemhttp.New, on pgx's
			// database/sql driver instead of lib/pq.
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(40)
			t.Cleanup(func() { _ = db.Close() })
			b.db = db
		}
		schema := testenv.UniqueName("idemhttp")
		exec(t, b.db, "CREATE SCHEMA "+schema)
		t.Cleanup(func() { _, _ = b.db.Exec("DROP SCHEMA " + schema + " CASCADE") })
		b.claims, b.effects = schema+".processed_messages", schema+".effects"
	case "mysql", "mysql-strict", "mysql-nonstrict":
		b.db, b.d, b.busy = openMySQL(t, sqlModes[name]), mysql.New(), true
		b.claims, b.effects = "processed_messages", "effects"
	case "sqlite":
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "test.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		b.db, b.d = db, sqlite.New()
		b.claims, b.effects = "processed_messages", "effects"
	}
	exec(t, b.db, "CREATE TABLE "+b.effects+" (k VARCHAR(200) NOT NULL, body VARCHAR(2000) NOT NULL)")
	return b
}

// sqlModes are the session sql_modes of the "mysql-strict" and
// "mysql-nonstrict" backends; "mysql" keeps the server's.
var sqlModes = map[string]string{
	"mysql-strict":    "STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION",
	"mysql-nonstrict": "NO_ENGINE_SUBSTITUTION",
}

// openMySQL returns a pool on a database of the test's own on
// IDEMPOTENT_MYSQL_DSN's server (MariaDB at 127.0.0.1:3306 by default),
// whose sessions run in sqlMode ("" for the server's own).
func openMySQL(t testing.TB, sqlMode string) *sql.DB {
	t.Helper()
	server := testenv.Getenv("IDEMPOTENT_MYSQL_SERVER", "root@tcp(127.0.0.1:3306)/")
	admin, err := sql.Open("mysql", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		testenv.Unavailable(t, "no MySQL/MariaDB at %s: %v", server, err)
	}
	name := testenv.UniqueName("idemhttp")
	exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
	dsn := server + name
	if sqlMode != "" {
		dsn += "?sql_mode=" + url.QueryEscape("'"+sqlMode+"'")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func exec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// app is the handler under test: it records the request's body under the
// request's X-Order header in the effects table, through the claim's
// transaction, and answers 201 with a random nonce, so two runs of the
// handler never answer the same bytes.
type app struct {
	b     *backend
	calls atomic.Int64
	// hook, when set, runs after the effect and may write the response
	// itself (returning true).
	hook func(w http.ResponseWriter, r *http.Request, call int64) bool
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := a.calls.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := a.b.execTx(r.Context(), "INSERT INTO "+a.b.effects+" (k, body) VALUES (?, ?)", r.Header.Get("X-Order"), string(body)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a.hook != nil && a.hook(w, r, call) {
		return
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+r.Header.Get("X-Order"))
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q,"nonce":%q}`, r.Header.Get("X-Order"), hex.EncodeToString(nonce))
}

// server starts a real HTTP server on loopback for h, with its error log
// (a handler's panic) discarded.
func server(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// response is what a client saw.
type response struct {
	status   int
	header   http.Header
	body     string
	replayed bool
}

// post sends a POST of body to url with the idempotency key and order, and
// extra header fields as name, value pairs.
func post(t testing.TB, c *http.Client, url, key, order, body string, extra ...string) (response, error) {
	t.Helper()
	return send(t, c, http.MethodPost, url, key, order, body, extra...)
}

func send(t testing.TB, c *http.Client, method, url, key, order, body string, extra ...string) (response, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// No transport-level retry: net/http's Transport would resend a
	// request with an Idempotency-Key on its own after a broken
	// connection, and the tests decide themselves when to retry.
	req.GetBody = nil
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Order", order)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: res.StatusCode, header: res.Header, body: string(b), replayed: res.Header.Get(idemhttp.ReplayedHeader) == "true"}, nil
}

// mustPost is post that fails the test on a transport error.
func mustPost(t testing.TB, c *http.Client, url, key, order, body string, extra ...string) response {
	t.Helper()
	r, err := post(t, c, url, key, order, body, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
