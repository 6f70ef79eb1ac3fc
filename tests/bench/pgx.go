package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/tests/internal/latencyproxy"
)

// pgxOptions is what -pgx measures.
type pgxOptions struct {
	workers   int
	rounds    int
	cell      time.Duration
	warmup    time.Duration
	latencies []time.Duration // one-way delays of the proxy; 0 is none
	allocOps  int             // serial operations per allocation count
}

// parseLatencies parses -latency: comma-separated durations, 0 for a direct
// connection.
func parseLatencies(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("-latency: %q is not a duration such as 0, 250us or 1ms", f)
		}
		if slices.Contains(out, d) {
			return nil, fmt.Errorf("-latency: %v given twice", d)
		}
		out = append(out, d)
	}
	return out, nil
}

// pgxComparison is one head-to-head comparison: two operations alternating
// on the same workers, and the target their ratio of mean latencies (b's
// over a's: how many times faster a is) aims at.
type pgxComparison struct {
	name, target string
	min          float64
	aName, bName string
	a, b         func(*pgxEnv) func(context.Context) error
}

// pgxGroup is the group size of the coalesced variants of -pgx, and the
// batch size they are compared with: head to head, half the workers run
// each side, so a group gathers at most pgxWorkers/2 callers.
const pgxGroup = 4

// pgxPerB is, for a comparison whose second operation processes several
// messages (a batch), how many: its ratio and mean are then per message.
var pgxPerB = map[string]int{"coqueued-vs-batch": pgxGroup}

var pgxComparisons = []pgxComparison{
	{"process-vs-handwritten", "`ProcessMessage` ≥ 1.15× hand-written pgx (BEGIN, claim, effect, COMMIT), head to head", 1.15,
		"`ProcessMessage`", "hand-written pgx",
		func(e *pgxEnv) func(context.Context) error { return e.process },
		func(e *pgxEnv) func(context.Context) error { return e.handwritten }},
	{"dup-vs-sql", "pgx duplicate ≥ 1.3× `database/sql` duplicate (pgx stdlib), head to head", 1.3,
		"pgx duplicate", "`database/sql` duplicate",
		func(e *pgxEnv) func(context.Context) error { return e.dupPgx },
		func(e *pgxEnv) func(context.Context) error { return e.dupSQL }},
	{"seen-vs-dup", "pre-check duplicate ≥ 3× pgx database duplicate, head to head", 3,
		"pre-check duplicate", "pgx duplicate",
		func(e *pgxEnv) func(context.Context) error { return e.dupSeen },
		func(e *pgxEnv) func(context.Context) error { return e.dupPgx }},
	{"seen-vs-sql", "pre-check duplicate ≥ 3× `database/sql` database duplicate, head to head", 3,
		"pre-check duplicate", "`database/sql` duplicate",
		func(e *pgxEnv) func(context.Context) error { return e.dupSeen },
		func(e *pgxEnv) func(context.Context) error { return e.dupSQL }},
	{"queued-vs-process", "`ProcessMessage` with queued effects (`idempgx.Queue`) ≥ 1.3× `ProcessMessage`, head to head", 1.3,
		"queued `ProcessMessage`", "`ProcessMessage`",
		func(e *pgxEnv) func(context.Context) error { return e.queued },
		func(e *pgxEnv) func(context.Context) error { return e.process }},
	{"queuedonly-vs-process", "`ProcessMessage` under `WithQueuedOnly` (handler first, then claim, effects and COMMIT in one round trip) ≥ 1.3× `ProcessMessage`, head to head", 1.3,
		"`WithQueuedOnly` `ProcessMessage`", "`ProcessMessage`",
		func(e *pgxEnv) func(context.Context) error { return e.queuedOnly },
		func(e *pgxEnv) func(context.Context) error { return e.process }},
	{"coqueued-vs-process", fmt.Sprintf("coalesced groups of up to %d with queued effects (`WithQueuedOnly`: one round trip a group) ≥ 1× `ProcessMessage`, head to head (against coalesce-limit.sh's ceiling: not measured here)", pgxGroup), 1,
		"coalesced queued", "`ProcessMessage`",
		func(e *pgxEnv) func(context.Context) error { return e.coQueued },
		func(e *pgxEnv) func(context.Context) error { return e.process }},
	{"coqueued-vs-batch", fmt.Sprintf("coalesced groups of up to %d with queued effects (`WithQueuedOnly`) ≥ 0.5× `ProcessMessages` of %d, per message, head to head", pgxGroup, pgxGroup), 0.5,
		"coalesced queued", fmt.Sprintf("`ProcessMessages` of %d, per message", pgxGroup),
		func(e *pgxEnv) func(context.Context) error { return e.coQueued },
		func(e *pgxEnv) func(context.Context) error { return e.batch }},
	{"event-vs-handwritten", "lib/pq: `ProcessMessage` with an event time, the horizon read in the claim, ≥ 1.0× the guide's hand-written claim, head to head", 1,
		"event time, no lease", "hand-written (lib/pq)",
		func(e *pgxEnv) func(context.Context) error { return e.pqEvent },
		func(e *pgxEnv) func(context.Context) error { return e.pqHandwritten }},
	{"leased-vs-handwritten", "lib/pq: `ProcessMessage` with an event time and `WithHorizonLease` ≥ 1.0× the guide's hand-written claim, head to head", 1,
		"event time, leased", "hand-written (lib/pq)",
		func(e *pgxEnv) func(context.Context) error { return e.pqLeased },
		func(e *pgxEnv) func(context.Context) error { return e.pqHandwritten }},
	{"http-vs-bare", "idemhttp on pgx (`pgxhttp`, the response sent with COMMIT) ≤ 1.10× the bare pgx handler, in process: bare/with ≥ 0.909×, head to head", 1 / 1.10,
		"`pgxhttp`", "bare pgx handler",
		func(e *pgxEnv) func(context.Context) error { return e.httpWith },
		func(e *pgxEnv) func(context.Context) error { return e.httpBare }},
	{"replay-vs-first", "idemhttp on pgx: a replay (read before claiming) ≥ 5× faster than a first request, in process, head to head", 5,
		"`pgxhttp` replay", "`pgxhttp` first request",
		func(e *pgxEnv) func(context.Context) error { return e.httpReplay },
		func(e *pgxEnv) func(context.Context) error { return e.httpWith }},
}

// pgxSetting is what one network setting (a proxy delay, or none)
// measured, round by round.
type pgxSetting struct {
	latency time.Duration
	rtt     time.Duration
	ratios  map[string][]float64 // comparison name → b/a mean latency ratio per round
	meanA   map[string][]float64 // µs per op
	meanB   map[string][]float64
	alone   map[string][]float64 // "process", "handwritten" → msgs/s alone per round
	allocs  map[string][]float64 // "process", "handwritten", "pgx_dup" → allocs/msg per round
}

func (s *pgxSetting) label() string {
	if s.latency == 0 {
		return fmt.Sprintf("loopback (rtt %s)", micros(s.rtt))
	}
	return fmt.Sprintf("proxy, %v each way (rtt %s)", s.latency, micros(s.rtt))
}

func micros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

// pgxEnv is the pgx path and its competitors on one database address.
type pgxEnv struct {
	pool                                          *pgxpool.Pool
	db                                            *sql.DB
	process, handwritten, dupPgx, dupSQL, dupSeen func(context.Context) error
	// queued is process with its effect queued (idempgx.Queue), coQueued
	// the same on a Middleware coalescing groups of up to pgxGroup whose
	// handlers only queue (WithQueuedOnly: two round trips a group), batch
	// ProcessMessages of pgxGroup messages with the effect in one pgx.Batch.
	queued, coQueued, batch func(context.Context) error
	// queuedOnly is queued on a Middleware made WithQueuedOnly, without
	// coalescing: one round trip a message.
	queuedOnly func(context.Context) error
	// pqEvent is the core's ProcessMessage on lib/pq with an event time,
	// pqLeased the same WithHorizonLease, pqHandwritten the guide's
	// hand-written claim and effect on lib/pq.
	pqEvent, pqLeased, pqHandwritten func(context.Context) error
	// httpBare is the loyalty handler in a pgx transaction of its own,
	// httpWith the same under pgxhttp with a new key, httpReplay a key
	// already answered; each a request served in process.
	httpBare, httpWith, httpReplay func(context.Context) error
	pq                             *sql.DB
}

func (e *pgxEnv) close() {
	e.pool.Close()
	_ = e.db.Close()
	if e.pq != nil {
		_ = e.pq.Close()
	}
}

// newPgxEnv opens a pgx pool and a database/sql pool (pgx stdlib) of
// workers connections each on dsn, and the operations compared, on the
// tables of schema s.
func newPgxEnv(ctx context.Context, dsn, s string, workers int, seq *atomic.Int64) (*pgxEnv, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("-pgx: %w", err)
	}
	cfg.MaxConns = int32(workers)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("-pgx: %w", err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("-pgx: %w", err)
	}
	db.SetMaxOpenConns(workers)
	db.SetMaxIdleConns(workers)
	e := &pgxEnv{pool: p, db: db}
	fail := func(err error) (*pgxEnv, error) {
		e.close()
		return nil, fmt.Errorf("-pgx: %w", err)
	}
	table := s + ".claims"
	m, err := idempgx.New(p, "loyalty", idempgx.WithTable(table))
	if err != nil {
		return fail(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		return fail(err)
	}
	lru, err := idempotent.NewSeenLRU(1 << 16)
	if err != nil {
		return fail(err)
	}
	ms, err := idempgx.New(p, "loyalty", idempgx.WithTable(table), idempgx.WithSeen(lru))
	if err != nil {
		return fail(err)
	}
	core, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(table))
	if err != nil {
		return fail(err)
	}
	t, err := dialect.ParseTable(table)
	if err != nil {
		return fail(err)
	}
	claimSQL := postgres.New().ClaimSQL(t)
	upd := "UPDATE " + s + ".balances SET points = points + 10 WHERE customer_id = $1"
	ins := "INSERT INTO " + s + ".ledger (customer_id, order_id, points) VALUES ($1, $2, 10)"
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "o_" + hex.EncodeToString(b)
	next := func() (string, int64, int64) {
		n := seq.Add(1)
		return prefix + ":" + strconv.FormatInt(n, 10), n, 1 + mrand.Int64N(pgxCustomers)
	}
	effect := func(ctx context.Context, tx pgx.Tx, cid, oid int64) error {
		if _, err := tx.Exec(ctx, upd, cid); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ins, cid, oid)
		return err
	}
	e.process = func(ctx context.Context) error {
		k, oid, cid := next()
		_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, tx, cid, oid) })
		return err
	}
	e.handwritten = func(ctx context.Context) error {
		k, oid, cid := next()
		tx, err := p.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		tag, err := tx.Exec(ctx, claimSQL, "loyalty", k)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		if err := effect(ctx, tx, cid, oid); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	queue := func(tx pgx.Tx, cid, oid int64) error {
		if err := idempgx.Queue(tx, upd, cid); err != nil {
			return err
		}
		return idempgx.Queue(tx, ins, cid, oid)
	}
	// queuedOn is the loyalty message with its effect queued, on mw.
	queuedOn := func(mw *idempgx.Middleware) func(context.Context) error {
		return func(ctx context.Context) error {
			k, oid, cid := next()
			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error { return queue(tx, cid, oid) })
			return err
		}
	}
	mq, err := idempgx.New(p, "loyalty", idempgx.WithTable(table), idempgx.WithQueuedOnly())
	if err != nil {
		return fail(err)
	}
	mc, err := idempgx.New(p, "loyalty", idempgx.WithTable(table), idempgx.WithQueuedOnly(),
		idempgx.WithCoalescing(idempotent.Coalescing{Max: pgxGroup, Wait: 500 * time.Microsecond}))
	if err != nil {
		return fail(err)
	}
	e.queued, e.queuedOnly, e.coQueued = queuedOn(m), queuedOn(mq), queuedOn(mc)
	e.batch = func(ctx context.Context) error {
		msgs := make([]idempotent.Message, pgxGroup)
		oids, cids := make([]int64, pgxGroup), make([]int64, pgxGroup)
		for i := range msgs {
			msgs[i].Key, oids[i], cids[i] = next()
		}
		_, err := m.ProcessMessages(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			var b pgx.Batch
			for _, i := range fresh {
				b.Queue(upd, cids[i])
				b.Queue(ins, cids[i], oids[i])
			}
			return tx.SendBatch(ctx, &b).Close()
		})
		return err
	}
	if err := addLeaseOps(ctx, e, dsn, table, workers, claimSQL, upd, ins, next); err != nil {
		return fail(err)
	}
	if err := addHTTPOps(ctx, e, table, upd, ins, next); err != nil {
		return fail(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, noop); err != nil {
		return fail(err)
	}
	if _, err := ms.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, noop); err != nil {
		return fail(err)
	}
	e.dupPgx = func(ctx context.Context) error {
		return expectDuplicate(m.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, noop))
	}
	e.dupSQL = func(ctx context.Context) error {
		return expectDuplicate(core.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, *sql.Tx) error { return nil }))
	}
	e.dupSeen = func(ctx context.Context) error {
		return expectDuplicate(ms.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, noop))
	}
	return e, nil
}

const pgxCustomers = 100000

func expectDuplicate(o idempotent.Outcome, err error) error {
	if err == nil && o != idempotent.Duplicate {
		return fmt.Errorf("outcome %v, want duplicate", o)
	}
	return err
}

// runPgx measures the pgx path (idempgx) against hand-written pgx code and
// against the database/sql path, at each network setting, and writes a
// Markdown section to w.
func runPgx(ctx context.Context, dsn string, o pgxOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("-pgx: connect to %s: %w", dsn, err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := "pgxbench_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+s); err != nil {
		return fmt.Errorf("-pgx: %w", err)
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+s+" CASCADE"); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	for _, q := range []string{
		"CREATE TABLE " + s + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0)",
		"CREATE TABLE " + s + ".ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)",
		fmt.Sprintf("INSERT INTO %s.balances SELECT g, 0 FROM generate_series(1, %d) g", s, pgxCustomers),
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("-pgx: %w", err)
		}
	}
	var seq atomic.Int64
	var settings []*pgxSetting
	for _, lat := range o.latencies {
		st, err := measurePgxSetting(ctx, dsn, s, lat, o, &seq, log)
		if err != nil {
			return err
		}
		settings = append(settings, st)
	}
	pgxReport(w, server, args, o, started, time.Since(started), settings)
	return nil
}

// measurePgxSetting runs the rounds at one network setting: lat 0 is a
// direct connection, else a proxy delaying each direction by lat.
func measurePgxSetting(ctx context.Context, dsn, s string, lat time.Duration, o pgxOptions, seq *atomic.Int64, log io.Writer) (*pgxSetting, error) {
	target := dsn
	if lat > 0 {
		d, p, err := latencyproxy.DSN(dsn, lat)
		if err != nil {
			return nil, fmt.Errorf("-latency: %w", err)
		}
		defer p.Close()
		target = d
	}
	st := &pgxSetting{latency: lat, ratios: map[string][]float64{}, meanA: map[string][]float64{}, meanB: map[string][]float64{},
		alone: map[string][]float64{}, allocs: map[string][]float64{}}
	var err error
	if st.rtt, err = latencyproxy.RoundTrip(ctx, target); err != nil {
		return nil, fmt.Errorf("-pgx: %w", err)
	}
	e, err := newPgxEnv(ctx, target, s, o.workers, seq)
	if err != nil {
		return nil, err
	}
	defer e.close()
	// Warm every connection's statement cache.
	for _, f := range []func(context.Context) error{e.process, e.handwritten, e.dupPgx, e.dupSQL, e.dupSeen, e.queued, e.queuedOnly, e.coQueued, e.batch,
		e.pqEvent, e.pqLeased, e.pqHandwritten, e.httpBare, e.httpWith, e.httpReplay} {
		if _, err := pgxAlone(ctx, o.workers, o.warmup, f); err != nil {
			return nil, fmt.Errorf("-pgx: warm-up: %w", err)
		}
	}
	for r := range o.rounds {
		for _, v := range []struct {
			name string
			f    func(context.Context) error
		}{{"process", e.process}, {"handwritten", e.handwritten}} {
			rate, err := pgxAlone(ctx, o.workers, o.cell, v.f)
			if err != nil {
				return nil, fmt.Errorf("-pgx: %s alone: %w", v.name, err)
			}
			st.alone[v.name] = append(st.alone[v.name], rate)
		}
		for _, c := range pgxComparisons {
			ma, mb, err := pgxHeadToHead(ctx, o.workers, o.cell, c.a(e), c.b(e))
			if err != nil {
				return nil, fmt.Errorf("-pgx: %s: %w", c.name, err)
			}
			if n := pgxPerB[c.name]; n > 0 {
				mb /= float64(n)
			}
			st.ratios[c.name] = append(st.ratios[c.name], mb/ma)
			st.meanA[c.name] = append(st.meanA[c.name], ma/1e3)
			st.meanB[c.name] = append(st.meanB[c.name], mb/1e3)
		}
		// The proxy runs in this process and allocates too: count
		// allocations on direct connections only.
		if lat == 0 {
			for _, v := range []struct {
				name string
				f    func(context.Context) error
			}{{"process", e.process}, {"handwritten", e.handwritten}, {"pgx_dup", e.dupPgx}} {
				a, err := pgxAllocs(ctx, o.allocOps, v.f)
				if err != nil {
					return nil, fmt.Errorf("-pgx: allocations of %s: %w", v.name, err)
				}
				st.allocs[v.name] = append(st.allocs[v.name], a)
			}
		}
		fmt.Fprintf(log, "pgx round %d/%d  %s  process alone %.0f msgs/s; process %.3f× hand-written, pgx dup %.3f× sql dup, seen %.1f× pgx dup; "+
			"queued %.3f× process, queued-only %.3f× process, coalesced queued %.3f× process and %.3f× batches; lib/pq event time %.3f×, leased %.3f× hand-written; "+
			"pgxhttp bare/with %.3f, replay %.2f× first\n",
			r+1, o.rounds, st.label(), last(st.alone["process"]), last(st.ratios["process-vs-handwritten"]),
			last(st.ratios["dup-vs-sql"]), last(st.ratios["seen-vs-dup"]),
			last(st.ratios["queued-vs-process"]), last(st.ratios["queuedonly-vs-process"]), last(st.ratios["coqueued-vs-process"]), last(st.ratios["coqueued-vs-batch"]),
			last(st.ratios["event-vs-handwritten"]), last(st.ratios["leased-vs-handwritten"]), last(st.ratios["http-vs-bare"]), last(st.ratios["replay-vs-first"]))
	}
	return st, nil
}

func last(xs []float64) float64 { return xs[len(xs)-1] }

// pgxHeadToHead runs a and b alternately, operation by operation, on
// workers goroutines for d and returns their mean latencies in
// nanoseconds. Each worker starts with one or the other at random.
func pgxHeadToHead(ctx context.Context, workers int, d time.Duration, a, b func(context.Context) error) (meanA, meanB float64, err error) {
	var ta, tb, na, nb atomic.Int64
	opCtx := context.Background() // see pgxWorkers
	err = pgxWorkers(ctx, workers, d, func(i int) error {
		f, t, n := a, &ta, &na
		if i%2 == 1 {
			f, t, n = b, &tb, &nb
		}
		start := time.Now()
		if err := f(opCtx); err != nil {
			return err
		}
		t.Add(int64(time.Since(start)))
		n.Add(1)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if na.Load() == 0 || nb.Load() == 0 {
		return 0, 0, errors.New("a variant ran no operation: lengthen -cell")
	}
	return float64(ta.Load()) / float64(na.Load()), float64(tb.Load()) / float64(nb.Load()), nil
}

// pgxAlone runs f on workers goroutines for d and returns operations per
// second.
func pgxAlone(ctx context.Context, workers int, d time.Duration, f func(context.Context) error) (float64, error) {
	var n atomic.Int64
	opCtx := context.Background() // see pgxWorkers
	start := time.Now()
	err := pgxWorkers(ctx, workers, d, func(int) error {
		if err := f(opCtx); err != nil {
			return err
		}
		n.Add(1)
		return nil
	})
	return float64(n.Load()) / time.Since(start).Seconds(), err
}

// pgxWorkers calls op(i) on workers goroutines, i counting each worker's
// calls from a random 0 or 1, until d has passed, ctx ends or an op fails.
//
// The operations themselves run on context.Background(), as in the Go
// benchmarks: pgx takes a shorter path for that very context than for any
// other, even one that cannot be cancelled (a derived context costs the pgx
// path one more allocation per message, and a cancellable one pgx's
// context watching on every statement). An interrupt stops the cell
// between operations.
func pgxWorkers(ctx context.Context, workers int, d time.Duration, op func(i int) error) error {
	var stop atomic.Bool
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := mrand.IntN(2); !stop.Load(); i++ {
				if err := op(i); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
					return
				}
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
	if first != nil {
		return first
	}
	return ctx.Err()
}

// pgxAllocs runs f n times in a row, after a warm-up, and returns the heap
// allocations of the whole process per call.
func pgxAllocs(ctx context.Context, n int, f func(context.Context) error) (float64, error) {
	opCtx := context.Background() // see pgxWorkers
	for range 10 {
		if err := f(opCtx); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if err := f(opCtx); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(n), ctx.Err()
}

// pgxReport writes the -pgx section.
func pgxReport(w io.Writer, server string, args []string, o pgxOptions, started time.Time, took time.Duration, settings []*pgxSetting) {
	fmt.Fprintf(w, "## The pgx path (idempgx) and the duplicate pre-check\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; %d round%s; %d workers; pgx pools (and a `database/sql` pool, pgx stdlib, for its duplicate) of %d connections.\n\n",
		runLine(started, took, server), o.rounds, plural(o.rounds), o.workers, o.workers)
	fmt.Fprintf(w, "The guide's loyalty workload: per message a claim, then `UPDATE balances SET points = points + 10 WHERE customer_id = $1` "+
		"and `INSERT INTO ledger …`, one transaction. Hand-written pgx sends BEGIN, the claim, the effect and COMMIT as separate statements. "+
		"Head to head: each worker alternates the two operations compared, operation by operation, for %v per round, so that the drift of a "+
		"shared machine falls on both; the ratio is the second's mean latency over the first's (how many times faster the first is). "+
		"\"Alone\" is each running by itself on all the workers for %v, one after the other. Allocations are the whole process's heap "+
		"allocations per message over %d calls in a row on one goroutine, on direct connections only (the proxy runs in the process).",
		o.cell, o.cell, o.allocOps)
	if slices.ContainsFunc(settings, func(s *pgxSetting) bool { return s.latency > 0 }) {
		fmt.Fprint(w, " The proxy delays each direction by the given time, as a network with that one-way latency would; rtt is the median "+
			"`SELECT 1` round trip measured through it (Go's timers round the delays up).")
	}
	fmt.Fprint(w, "\n\n")
	fmt.Fprintln(w, "| target | network | by round | median | met |")
	fmt.Fprintln(w, "|---|---|---|---:|---|")
	for _, c := range pgxComparisons {
		for _, st := range settings {
			rs := st.ratios[c.name]
			m := median(rs)
			fmt.Fprintf(w, "| %s | %s | %s | **%s** | %s |\n", c.target, st.label(), joinFunc(rs, times), times(m), met(m >= c.min))
		}
	}
	for _, st := range settings {
		if len(st.allocs["process"]) == 0 {
			continue
		}
		p, h := median(st.allocs["process"]), median(st.allocs["handwritten"])
		fmt.Fprintf(w, "| allocations/msg of `ProcessMessage` ≤ hand-written pgx + 3 | %s | %s | **%+.1f** (%.1f vs %.1f) | %s |\n",
			st.label(), joinDiffs(st.allocs["process"], st.allocs["handwritten"]), p-h, p, h, met(p <= h+3))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measure | network | by round | median |")
	fmt.Fprintln(w, "|---|---|---|---:|")
	for _, st := range settings {
		for _, v := range []struct{ name, label string }{{"process", "`ProcessMessage` alone, msgs/s"}, {"handwritten", "hand-written pgx alone, msgs/s"}} {
			fmt.Fprintf(w, "| %s | %s | %s | %.0f |\n", v.label, st.label(), joinFunc(st.alone[v.name], func(x float64) string { return fmt.Sprintf("%.0f", x) }), median(st.alone[v.name]))
		}
		for _, c := range pgxComparisons {
			fmt.Fprintf(w, "| head to head: %s, %s, mean µs/msg | %s | %s | %s, %s |\n", c.aName, c.bName, st.label(),
				joinPairs(st.meanA[c.name], st.meanB[c.name]), us(median(st.meanA[c.name])), us(median(st.meanB[c.name])))
		}
		for _, v := range []struct{ name, label string }{{"process", "`ProcessMessage`"}, {"handwritten", "hand-written pgx"}, {"pgx_dup", "pgx duplicate"}} {
			if a := st.allocs[v.name]; len(a) > 0 {
				fmt.Fprintf(w, "| allocations/msg, %s | %s | %s | %.1f |\n", v.label, st.label(), joinFunc(a, func(x float64) string { return fmt.Sprintf("%.1f", x) }), median(a))
			}
		}
	}
	if !slices.ContainsFunc(settings, func(s *pgxSetting) bool { return s.latency == 0 }) {
		fmt.Fprintln(w, "\nAllocations are counted on direct connections only: add 0 to -latency to count them.")
	}
	fmt.Fprintln(w)
}

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func joinFunc(xs []float64, f func(float64) string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = f(x)
	}
	return strings.Join(s, ", ")
}

// times writes a ratio: three decimals below 10, none from 10 up.
func times(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.3f×", r)
	}
	return fmt.Sprintf("%.0f×", r)
}

// us writes microseconds: one decimal below 10, none from 10 up.
func us(x float64) string {
	if x < 10 {
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.0f", x)
}

func joinDiffs(a, b []float64) string {
	s := make([]string, len(a))
	for i := range a {
		s[i] = fmt.Sprintf("%+.1f", a[i]-b[i])
	}
	return strings.Join(s, ", ")
}

func joinPairs(a, b []float64) string {
	s := make([]string, len(a))
	for i := range a {
		s[i] = us(a[i]) + ", " + us(b[i])
	}
	return strings.Join(s, "; ")
}
