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
)

// BenchmarkMiddleware runs the same handler — one INSERT and a 201 —
// without the middleware (in a transaction of its own) and with it (claim,
// INSERT, stored response, in the claim's transaction), alternating within
// one run so that both meet the same load, and reports the ratio of their
// times (with/without) and the time of a replay. Requests go straight to
// ServeHTTP, so the figures are the database's and the middleware's, not
// the network's.
func BenchmarkMiddleware(b *testing.B) {
	for _, name := range []string{"postgres", "sqlite"} {
		b.Run(name, func(b *testing.B) {
			be := openBackend(b, name)
			insert := be.bind("INSERT INTO " + be.effects + " (k, body) VALUES (?, ?)")
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				tx := idemhttp.TxFromContext(ctx)
				if tx == nil { // without the middleware: a transaction of its own
					own, err := be.db.BeginTx(ctx, nil)
					if err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					defer func() { _ = own.Rollback() }()
					tx = own
				}
				if _, err := tx.ExecContext(ctx, insert, r.Header.Get("X-Order"), "{}"); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if idemhttp.TxFromContext(ctx) == nil {
					if err := tx.Commit(); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"id":1}`))
			})
			_, h := be.middleware(b, idemhttp.GlobalScope)
			wrapped := h.Wrap(handler)
			serve := func(h http.Handler, key string) {
				req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", strings.NewReader("{}"))
				req.Header.Set("X-Order", key)
				req.Header.Set("Idempotency-Key", key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
			var plain, with, replay time.Duration
			n := 0
			for b.Loop() {
				key := strconv.Itoa(n)
				n++
				t0 := time.Now()
				serve(handler, "p"+key)
				t1 := time.Now()
				serve(wrapped, "w"+key)
				t2 := time.Now()
				serve(wrapped, "w"+key)
				replay += time.Since(t2)
				plain += t1.Sub(t0)
				with += t2.Sub(t1)
			}
			b.ReportMetric(float64(with)/float64(plain), "with/without")
			b.ReportMetric(float64(plain.Nanoseconds())/float64(n), "without-ns/req")
			b.ReportMetric(float64(with.Nanoseconds())/float64(n), "with-ns/req")
			b.ReportMetric(float64(replay.Nanoseconds())/float64(n), "replay-ns/req")
		})
	}
}
