package pgxhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
)

// sent records what a pool sends: each statement run alone, and each
// batch (a pipeline of statements sent in one round trip) as its list.
type sent struct {
	mu      sync.Mutex
	alone   []string
	batches [][]string
	open    map[*pgx.Conn][]string
}

func (s *sent) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alone = append(s.alone, d.SQL)
	return ctx
}

func (s *sent) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *sent) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[c] = []string{}
	return ctx
}

func (s *sent) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[c] = append(s.open[c], d.SQL)
}

func (s *sent) TraceBatchEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceBatchEndData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, s.open[c])
	delete(s.open, c)
}

func (s *sent) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alone, s.batches = nil, nil
}

// env is a pgx pool traced by sent, a schema of the test's own with an
// effects table, and the middleware on it.
type env struct {
	pool    *pgxpool.Pool
	sent    *sent
	effects string
	idem    *idemhttp.Middleware
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	db := testenv.OpenPostgres(t, 4)
	schema := testenv.UniqueName("pgxhttp")
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE") })
	e := &env{sent: &sent{open: map[*pgx.Conn][]string{}}, effects: schema + ".effects"}
	if _, err := db.Exec("CREATE TABLE " + e.effects + " (k text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.Tracer = e.sent
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	m, err := idempgx.New(e.pool, "orders-api", idempgx.WithTable(schema+".claims"), idempgx.WithLockTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if e.idem, err = pgxhttp.New(m, idemhttp.GlobalScope); err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.idem.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// post sends a POST with key to h and returns the answer.
func post(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"tea"}`))
	r.Header.Set(idemhttp.DefaultHeader, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The stored response is sent with COMMIT, in one pipeline, after the
// handler's own statement; nothing stores it in a round trip of its own.
func TestResponseRidesWithCommit(t *testing.T) {
	e := newEnv(t)
	h := e.idem.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := pgxhttp.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), "INSERT INTO "+e.effects+" (k) VALUES ('a')"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	}))
	e.sent.reset()
	if w := post(h, "k1"); w.Code != http.StatusCreated || w.Body.String() != "made" {
		t.Fatalf("first request: %d %q", w.Code, w.Body)
	}
	e.sent.mu.Lock()
	alone, batches := e.sent.alone, e.sent.batches
	e.sent.mu.Unlock()
	// The response table's own name, quoted as the statements have it.
	table := e.idem.Table()
	table = `"` + table[strings.LastIndexByte(table, '.')+1:] + `"`
	for _, q := range alone {
		if strings.Contains(q, table) {
			t.Errorf("the response was stored in a round trip of its own: %q", q)
		}
	}
	var found bool
	for _, b := range batches {
		n := len(b)
		if n >= 2 && strings.EqualFold(b[n-1], "commit") && strings.Contains(b[n-2], table) {
			found = true
		}
	}
	if !found {
		t.Errorf("no pipeline ends with the response's insert and COMMIT; batches %q, alone %q", batches, alone)
	}
	// The replay is the stored response, and the effect applied once.
	w := post(h, "k1")
	if w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %q %v", w.Code, w.Body, w.Header())
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.effects).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects: %d (%v), want 1", n, err)
	}
}

// A response whose queued insert fails (here a CHECK the stored status
// breaks) rolls back with the handler's effect: the client gets a 500 and
// the key stays free, so a retry runs the handler again.
func TestResponseInsertFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, "ALTER TABLE "+e.idem.Table()+" ADD CONSTRAINT no_299 CHECK (status <> 299)"); err != nil {
		t.Fatal(err)
	}
	status := http.StatusCreated + 98 // 299: refused by the CHECK
	var mu sync.Mutex
	h := e.idem.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := pgxhttp.TxFromContext(r.Context())
		if err := idempgx.Queue(tx, "INSERT INTO "+e.effects+" (k) VALUES ('a')"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
	}))
	if w := post(h, "k1"); w.Code != http.StatusInternalServerError {
		t.Fatalf("a response that cannot be stored: %d %q, want 500", w.Code, w.Body)
	}
	count := func() int {
		var n int
		if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.effects).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("%d effects after the failed store, want 0 (rolled back)", n)
	}
	mu.Lock()
	status = http.StatusCreated
	mu.Unlock()
	if w := post(h, "k1"); w.Code != http.StatusCreated || w.Header().Get(idemhttp.ReplayedHeader) == "true" {
		t.Fatalf("retry: %d, replayed %q; want a first 201", w.Code, w.Header().Get(idemhttp.ReplayedHeader))
	}
	if n := count(); n != 1 {
		t.Fatalf("%d effects after the retry, want 1", n)
	}
}

// A replay read first (while replays are frequent: here after one) is one
// statement on the pgx pool, alone: no transaction, no batch, one round
// trip.
func TestReplayReadFirstIsOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	h := e.idem.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	}))
	if w := post(h, "k1"); w.Code != http.StatusCreated {
		t.Fatalf("first request: %d %q", w.Code, w.Body)
	}
	for i := range 2 {
		e.sent.reset()
		w := post(h, "k1")
		if w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("replay %d: %d %q %v", i+1, w.Code, w.Body, w.Header())
		}
	}
	e.sent.mu.Lock()
	alone, batches := e.sent.alone, e.sent.batches
	e.sent.mu.Unlock()
	if len(alone) != 1 || len(batches) != 0 || !strings.Contains(alone[0], e.idem.Table()[strings.LastIndexByte(e.idem.Table(), '.')+1:]) {
		t.Errorf("the second replay sent %q alone and batches %q, want the stored response's read alone", alone, batches)
	}
}
