package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
)

// paths are one backend's handler — one INSERT and a 201 — without the
// middleware (in a transaction of its own, on the backend's driver) and
// with it (claim, INSERT, stored response, in the claim's transaction).
// replays is the same wrapped handler under a Middleware of its own on the
// same tables, for the replays: the wrapped path then sees first requests
// only, as in a service of first requests, and replays are read first, as
// in a run of retries (docs/http.md).
type paths struct {
	plain, wrapped, replays http.Handler
}

func benchPaths(b *testing.B, be *backend) paths {
	b.Helper()
	insert := be.bind("INSERT INTO " + be.effects + " (k, body) VALUES (?, ?)")
	answer := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}
	var handler http.HandlerFunc
	if be.pool != nil {
		handler = func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx := pgxhttp.TxFromContext(ctx)
			own := tx == nil
			if own { // without the middleware: a transaction of its own
				var err error
				if tx, err = be.pool.Begin(ctx); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				defer func() { _ = tx.Rollback(ctx) }()
			}
			if _, err := tx.Exec(ctx, insert, r.Header.Get("X-Order"), "{}"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if own {
				if err := tx.Commit(ctx); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			answer(w)
		}
	} else {
		handler = func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx := idemhttp.TxFromContext(ctx)
			own := tx == nil
			if own { // without the middleware: a transaction of its own
				var err error
				if tx, err = be.db.BeginTx(ctx, nil); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				defer func() { _ = tx.Rollback() }()
			}
			if _, err := tx.ExecContext(ctx, insert, r.Header.Get("X-Order"), "{}"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if own {
				if err := tx.Commit(); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			answer(w)
		}
	}
	_, h := be.middleware(b, idemhttp.GlobalScope)
	_, r := be.middleware(b, idemhttp.GlobalScope)
	return paths{plain: handler, wrapped: h.Wrap(handler), replays: r.Wrap(handler)}
}

// serve sends one POST with key straight to h.ServeHTTP.
func serve(b *testing.B, h http.Handler, key string) {
	req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", strings.NewReader("{}"))
	req.Header.Set("X-Order", key)
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		b.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// timings are the summed times of each path over n requests.
type timings struct {
	plain, with, replay time.Duration
}

// round times one request without the middleware, one with it (a new
// key) and its replay, with keys of round i.
func (t *timings) round(b *testing.B, p paths, prefix string, i int) {
	key := strconv.Itoa(i)
	t0 := time.Now()
	serve(b, p.plain, prefix+"p"+key)
	t1 := time.Now()
	serve(b, p.wrapped, prefix+"w"+key)
	t2 := time.Now()
	serve(b, p.replays, prefix+"w"+key)
	t.replay += time.Since(t2)
	t.plain += t1.Sub(t0)
	t.with += t2.Sub(t1)
}

func (t *timings) report(b *testing.B, prefix string, n int) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(float64(t.with)/float64(t.plain), prefix+"with/without")
	b.ReportMetric(per(t.plain), prefix+"without-ns/req")
	b.ReportMetric(per(t.with), prefix+"with-ns/req")
	b.ReportMetric(per(t.replay), prefix+"replay-ns/req")
}

// BenchmarkMiddleware runs the same handler without the middleware and
// with it, alternating within one run so that both meet the same load, and
// reports the ratio of their times (with/without) and the time of a
// replay. Requests go straight to ServeHTTP, so the figures are the
// database's and the middleware's, not the network's.
func BenchmarkMiddleware(b *testing.B) {
	for _, name := range []string{"postgres", "pgx", "sqlite"} {
		b.Run(name, func(b *testing.B) {
			p := benchPaths(b, openBackend(b, name))
			var t timings
			n := 0
			for b.Loop() {
				t.round(b, p, "", n)
				n++
			}
			t.report(b, "", n)
		})
	}
}

// BenchmarkPgx runs the pgx path (pgxhttp on idempgx, the handler on a
// pgx.Tx; without the middleware, a pgx transaction of its own) and the
// database/sql path on lib/pq, each with and without the middleware,
// alternating within one run on the same server: pgx- and sql- metrics as
// BenchmarkMiddleware's, and the ratios of the pgx path's times to the
// database/sql path's with the middleware (pgx/sql-with) and for a replay
// (pgx/sql-replay).
func BenchmarkPgx(b *testing.B) {
	pg := benchPaths(b, openBackend(b, "pgx"))
	sq := benchPaths(b, openBackend(b, "postgres"))
	var tp, ts timings
	n := 0
	for b.Loop() {
		tp.round(b, pg, "", n)
		ts.round(b, sq, "", n)
		n++
	}
	tp.report(b, "pgx-", n)
	ts.report(b, "sql-", n)
	b.ReportMetric(float64(tp.with)/float64(ts.with), "pgx/sql-with")
	b.ReportMetric(float64(tp.replay)/float64(ts.replay), "pgx/sql-replay")
}
