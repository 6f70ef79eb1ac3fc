package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
)

// httpOptions is what -http measures.
type httpOptions struct {
	workers int
	rounds  int
	cell    time.Duration
	warmup  time.Duration
}

// httpPath is one way of serving the loyalty request: a route of the
// loopback server, and what a client sends to it.
type httpPath struct {
	name, label string
	route       string
	replay      bool   // the request repeats a key already answered
	base        string // the path whose ratio to this one the report gives
}

// httpPaths are the paths -http compares. The handler is the same on each
// driver: it decodes the order, credits the points (UPDATE balances, INSERT
// ledger) and answers 201 with a small JSON body.
var httpPaths = []httpPath{
	{name: "sql-without", label: "`database/sql` (lib/pq), without the middleware", route: "/sql/plain"},
	{name: "sql-with", label: "`database/sql` (lib/pq), `idemhttp.New`", route: "/sql/idem", base: "sql-without"},
	{name: "sql-replay", label: "`database/sql` (lib/pq), replay", route: "/sql/replay", replay: true, base: "sql-with"},
	{name: "pgx-without", label: "pgx, without the middleware", route: "/pgx/plain"},
	{name: "pgx-with", label: "pgx, `pgxhttp.New` (idempgx)", route: "/pgx/idem", base: "pgx-without"},
	{name: "pgx-replay", label: "pgx, replay", route: "/pgx/replay", replay: true, base: "pgx-with"},
}

// httpStats is what one path measured over the rounds.
type httpStats struct {
	alone []float64       // requests/s alone, per round
	lat   []time.Duration // latencies alone, all rounds
	mean  []float64       // mean µs per request head to head, per round
}

// httpOrder is the request body.
type httpOrder struct {
	Customer int64 `json:"customer"`
	Order    int64 `json:"order"`
}

// httpEnv is the loopback server, its pools and its client.
type httpEnv struct {
	url    string
	client *http.Client
	srv    *http.Server
	db     *sql.DB
	pool   *pgxpool.Pool
	prefix string
	seq    atomic.Int64
}

func (e *httpEnv) close() {
	_ = e.srv.Close()
	e.client.CloseIdleConnections()
	e.pool.Close()
	_ = e.db.Close()
}

// newHTTPEnv opens a lib/pq pool and a pgx pool of workers connections on
// dsn, builds the handlers on the tables of schema s and serves them on a
// loopback port.
func newHTTPEnv(ctx context.Context, dsn, s string, workers int) (*httpEnv, error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(workers)
	db.SetMaxIdleConns(workers)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	cfg.MaxConns = int32(workers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		_ = db.Close()
		return nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	e := &httpEnv{url: "http://" + ln.Addr().String(), db: db, pool: pool, prefix: "k" + hex.EncodeToString(b),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true}}}
	e.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second}
	fail := func(err error) (*httpEnv, error) {
		_ = ln.Close()
		e.close()
		return nil, err
	}
	table := s + ".claims"
	lockTimeout := idempotent.WithLockTimeout(500 * time.Millisecond)
	core, err := idempotent.New(db, postgres.New(), "http-sql", idempotent.WithTable(table), lockTimeout)
	if err != nil {
		return fail(err)
	}
	withSQL, err := idemhttp.New(core, idemhttp.GlobalScope)
	if err != nil {
		return fail(err)
	}
	m, err := idempgx.New(pool, "http-pgx", idempgx.WithTable(table), idempgx.WithLockTimeout(500*time.Millisecond))
	if err != nil {
		return fail(err)
	}
	withPgx, err := pgxhttp.New(m, idemhttp.GlobalScope)
	if err != nil {
		return fail(err)
	}
	// The replays have Middlewares of their own on the same tables: each
	// path's figures are then those of its own traffic, first requests in a
	// service of first requests, replays in a run of replays, which a
	// Middleware reads first (docs/http.md), not those of the mix that
	// interleaving the paths would make.
	replaySQL, err := idemhttp.New(core, idemhttp.GlobalScope)
	if err != nil {
		return fail(err)
	}
	replayPgx, err := pgxhttp.New(m, idemhttp.GlobalScope)
	if err != nil {
		return fail(err)
	}
	if err := core.EnsureSchema(ctx); err != nil {
		return fail(err)
	}
	if err := withSQL.EnsureSchema(ctx); err != nil {
		return fail(err)
	}
	upd := "UPDATE " + s + ".balances SET points = points + 10 WHERE customer_id = $1"
	ins := "INSERT INTO " + s + ".ledger (customer_id, order_id, points) VALUES ($1, $2, 10)"
	// The database/sql handler: in the claim's transaction under the
	// middleware, else in one of its own.
	sqlHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, ok := decode(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		tx := idemhttp.TxFromContext(ctx)
		own := tx == nil
		if own {
			var err error
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer func() { _ = tx.Rollback() }()
		}
		if _, err := tx.ExecContext(ctx, upd, o.Customer); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(ctx, ins, o.Customer, o.Order); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if own {
			if err := tx.Commit(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		answer(w, o)
	})
	// The pgx handler, the same on a pgx.Tx.
	pgxHandler := pgxLoyaltyHandler(pool, upd, ins)
	mux := http.NewServeMux()
	mux.Handle("POST /sql/plain", sqlHandler)
	mux.Handle("POST /sql/idem", withSQL.Wrap(sqlHandler))
	mux.Handle("POST /pgx/plain", pgxHandler)
	mux.Handle("POST /pgx/idem", withPgx.Wrap(pgxHandler))
	mux.Handle("POST /sql/replay", replaySQL.Wrap(sqlHandler))
	mux.Handle("POST /pgx/replay", replayPgx.Wrap(pgxHandler))
	e.srv.Handler = mux
	go func() { _ = e.srv.Serve(ln) }()
	// The keys the replays repeat: one per worker and path, answered once.
	for _, p := range httpPaths {
		if !p.replay {
			continue
		}
		for w := range workers {
			if err := e.send(ctx, p, w, false); err != nil {
				return fail(fmt.Errorf("first request of a replayed key: %w", err))
			}
		}
	}
	return e, nil
}

// decode reads the order.
func decode(w http.ResponseWriter, r *http.Request) (httpOrder, bool) {
	var o httpOrder
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return o, false
	}
	return o, true
}

// answer writes the 201.
func answer(w http.ResponseWriter, o httpOrder) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"order":%d,"points":10}`, o.Order)
}

// pgxLoyaltyHandler is the loyalty handler on pgx: in the claim's
// transaction under pgxhttp, else in one of its own on pool.
func pgxLoyaltyHandler(pool *pgxpool.Pool, upd, ins string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, ok := decode(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		tx := pgxhttp.TxFromContext(ctx)
		own := tx == nil
		if own {
			var err error
			if tx, err = pool.Begin(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
		}
		if err := pgxEffect(ctx, tx, upd, ins, o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if own {
			if err := tx.Commit(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		answer(w, o)
	})
}

// pgxEffect credits the order's points in tx.
func pgxEffect(ctx context.Context, tx pgx.Tx, upd, ins string, o httpOrder) error {
	if _, err := tx.Exec(ctx, upd, o.Customer); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, ins, o.Customer, o.Order)
	return err
}

// send makes worker w's request of path p and checks its answer: a 201,
// replayed when p is a replay path and replayed is true. A path that is
// not a replay gets a new order and a new key; a replay path repeats the
// order and key of worker w.
func (e *httpEnv) send(ctx context.Context, p httpPath, w int, replayed bool) error {
	var o httpOrder
	var key string
	if p.replay {
		o = httpOrder{Customer: 1 + int64(w), Order: -1 - int64(w)}
		key = e.prefix + ":" + p.name + ":" + strconv.Itoa(w)
	} else {
		n := e.seq.Add(1)
		o = httpOrder{Customer: 1 + mrand.Int64N(pgxCustomers), Order: n}
		key = e.prefix + ":" + strconv.FormatInt(n, 10)
	}
	body, _ := json.Marshal(o)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+p.route, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.DefaultHeader, key)
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%s: %s: %s", p.name, resp.Status, bytes.TrimSpace(got))
	}
	if want := fmt.Sprintf(`{"order":%d,"points":10}`, o.Order); string(got) != want {
		return fmt.Errorf("%s: body %q, want %q", p.name, got, want)
	}
	if r := resp.Header.Get(idemhttp.ReplayedHeader) == "true"; r != (p.replay && replayed) {
		return fmt.Errorf("%s: %s: %q, want replayed %v", p.name, idemhttp.ReplayedHeader, resp.Header.Get(idemhttp.ReplayedHeader), p.replay && replayed)
	}
	return nil
}

// httpCell runs the paths on workers goroutines for d, each worker sending
// them in turn, request by request, from a random one, each at least once,
// and returns each path's latencies and the time the cell took. It stops at
// the first error.
func (e *httpEnv) httpCell(ctx context.Context, workers int, d time.Duration, paths []httpPath) ([][]time.Duration, time.Duration, error) {
	var stop atomic.Bool
	var once sync.Once
	var first error
	lat := make([][][]time.Duration, workers) // worker, path
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		lat[w] = make([][]time.Duration, len(paths))
		wg.Go(func() {
			// Every worker sends every path at least once.
			i0 := mrand.IntN(len(paths))
			for i := i0; i < i0+len(paths) || !stop.Load(); i++ {
				k := i % len(paths)
				t := time.Now()
				// The requests run on context.Background(): an interrupt
				// stops the cell between them.
				if err := e.send(context.Background(), paths[k], w, true); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
					return
				}
				if ctx.Err() != nil {
					return
				}
				lat[w][k] = append(lat[w][k], time.Since(t))
			}
		})
	}
	t := time.NewTimer(d)
	defer t.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-done:
	}
	stop.Store(true)
	<-done
	took := time.Since(start)
	if first != nil {
		return nil, 0, first
	}
	out := make([][]time.Duration, len(paths))
	for w := range lat {
		for k := range paths {
			out[k] = append(out[k], lat[w][k]...)
		}
	}
	return out, took, ctx.Err()
}

// runHTTP measures the handler without the middleware, with it on
// database/sql and on pgx, and the replay path, over a loopback server, and
// writes a Markdown section to w.
func runHTTP(ctx context.Context, dsn string, o httpOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	admin, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := "httpbench_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+s); err != nil {
		return fmt.Errorf("-http: %w", err)
	}
	defer func() {
		if _, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+s+" CASCADE"); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	for _, q := range []string{
		"CREATE TABLE " + s + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0)",
		"CREATE TABLE " + s + ".ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)",
		fmt.Sprintf("INSERT INTO %s.balances SELECT g, 0 FROM generate_series(1, %d) g", s, pgxCustomers),
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("-http: %w", err)
		}
	}
	e, err := newHTTPEnv(ctx, dsn, s, o.workers)
	if err != nil {
		return fmt.Errorf("-http: %w", err)
	}
	defer e.close()
	if _, _, err := e.httpCell(ctx, o.workers, o.warmup, httpPaths); err != nil {
		return fmt.Errorf("-http: warm-up: %w", err)
	}
	res := map[string]*httpStats{}
	for _, p := range httpPaths {
		res[p.name] = &httpStats{}
	}
	for r := range o.rounds {
		// Alone: each path by itself on all the workers, from another
		// path each round.
		for i := range httpPaths {
			p := httpPaths[(i+r)%len(httpPaths)]
			lat, took, err := e.httpCell(ctx, o.workers, o.cell, []httpPath{p})
			if err != nil {
				return fmt.Errorf("-http: %s alone: %w", p.name, err)
			}
			st := res[p.name]
			st.alone = append(st.alone, float64(len(lat[0]))/took.Seconds())
			st.lat = append(st.lat, lat[0]...)
		}
		// Head to head: every worker sends the paths in turn.
		lat, _, err := e.httpCell(ctx, o.workers, o.cell, httpPaths)
		if err != nil {
			return fmt.Errorf("-http: head to head: %w", err)
		}
		for k, p := range httpPaths {
			res[p.name].mean = append(res[p.name].mean, meanMicros(lat[k]))
		}
		fmt.Fprintf(log, "http round %d/%d  with/without head to head: sql %.3f, pgx %.3f; first/replay: sql %.2f, pgx %.2f\n", r+1, o.rounds,
			last(res["sql-with"].mean)/last(res["sql-without"].mean), last(res["pgx-with"].mean)/last(res["pgx-without"].mean),
			last(res["sql-with"].mean)/last(res["sql-replay"].mean), last(res["pgx-with"].mean)/last(res["pgx-replay"].mean))
	}
	httpReport(w, server, args, o, started, time.Since(started), res)
	return nil
}

func meanMicros(l []time.Duration) float64 {
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	return float64(sum) / float64(len(l)) / float64(time.Microsecond)
}

// httpRatio is a ratio the -http section reports: of a's figure to b's.
type httpRatio struct {
	label string
	a, b  string
	// inverse: b's mean latency over a's (how many times faster a is),
	// else a's over b's (how many times slower).
	inverse bool
}

var httpRatios = []httpRatio{
	{label: "with/without, `database/sql`: time per request", a: "sql-with", b: "sql-without"},
	{label: "with/without, pgx: time per request", a: "pgx-with", b: "pgx-without"},
	{label: "replay, `database/sql`: times faster than a first request", a: "sql-replay", b: "sql-with", inverse: true},
	{label: "replay, pgx: times faster than a first request", a: "pgx-replay", b: "pgx-with", inverse: true},
	{label: "pgx/`database/sql`, with the middleware: time per request", a: "pgx-with", b: "sql-with"},
}

func (q httpRatio) byRound(res map[string]*httpStats) []float64 {
	a, b := res[q.a].mean, res[q.b].mean
	out := make([]float64, len(a))
	for i := range a {
		if q.inverse {
			out[i] = b[i] / a[i]
		} else {
			out[i] = a[i] / b[i]
		}
	}
	return out
}

// httpReport writes the -http section.
func httpReport(w io.Writer, server string, args []string, o httpOptions, started time.Time, took time.Duration, res map[string]*httpStats) {
	fmt.Fprintf(w, "## HTTP: the Idempotency-Key middleware (idemhttp) on a loopback server\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; %d round%s; %d workers, each a client with a keep-alive connection to a `net/http` server on 127.0.0.1 "+
		"in the same process; a lib/pq pool and a pgx pool of %d connections.\n\n",
		runLine(started, took, server), o.rounds, plural(o.rounds), o.workers, o.workers)
	fmt.Fprintf(w, "Each request is a `POST` of an order (JSON) with a new `Idempotency-Key`; the handler, the same with and without the "+
		"middleware, decodes it, runs the guide's loyalty effect — `UPDATE balances SET points = points + 10 WHERE customer_id = $1` and "+
		"`INSERT INTO ledger …` — and answers 201 with a small JSON body; without the middleware it does so in a transaction of its own "+
		"(`BeginTx`/`pool.Begin`, `Commit`), with it in the claim's, which also stores the response. A replay repeats a key already "+
		"answered (one per worker) and gets the stored response (`Idempotent-Replayed: true`), from a Middleware of its own on the same "+
		"tables, so that first requests are measured as in a service of first requests and replays as in a run of replays, which the "+
		"middleware reads before claiming (docs/http.md); every answer's status, body and replay "+
		"header are checked. \"Alone\": each path by itself on all the workers for %v per round; latency is the client's, request sent "+
		"to body read. \"Head to head\": every worker sends the six paths in turn, request by request, for %v per round, so that the "+
		"drift of a shared machine falls on all of them alike; the ratios below are of those mean latencies.\n\n", o.cell, o.cell)
	fmt.Fprintln(w, "| path | alone, requests/s | p50 ms | p99 ms | alone, × its base | head to head, mean ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, p := range httpPaths {
		st := res[p.name]
		base := "–"
		if p.base != "" {
			base = fmt.Sprintf("%.2f", median(st.alone)/median(res[p.base].alone))
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.2f | %s | %.2f |\n", p.label, median(st.alone), ms(percentile(st.lat, 0.50)),
			ms(percentile(st.lat, 0.99)), base, median(st.mean)/1e3)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "\"× its base\" is the path's throughput over that of the path above it (with the middleware over without; replay over with).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| head to head | by round | median |")
	fmt.Fprintln(w, "|---|---|---:|")
	for _, q := range httpRatios {
		rs := q.byRound(res)
		fmt.Fprintf(w, "| %s | %s | **%s** |\n", q.label, joinFunc(rs, times), times(median(rs)))
	}
	fmt.Fprintln(w)
}
