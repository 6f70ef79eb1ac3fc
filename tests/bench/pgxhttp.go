package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
)

// addHTTPOps adds to e the idemhttp operations on pgx: the loyalty
// handler alone in a pgx transaction of its own, under pgxhttp with a new
// key, and under pgxhttp with a key already answered, each a POST served
// in process (httptest), so that only the middleware's own cost is
// measured, not a loopback HTTP round trip.
func addHTTPOps(ctx context.Context, e *pgxEnv, table, upd, ins string, next func() (string, int64, int64)) error {
	m, err := idempgx.New(e.pool, "loyalty-http", idempgx.WithTable(table), idempgx.WithLockTimeout(500*time.Millisecond))
	if err != nil {
		return err
	}
	idem, err := pgxhttp.New(m, idemhttp.GlobalScope)
	if err != nil {
		return err
	}
	if err := idem.EnsureSchema(ctx); err != nil {
		return err
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		cid, _ := strconv.ParseInt(r.URL.Query().Get("c"), 10, 64)
		oid, _ := strconv.ParseInt(r.URL.Query().Get("o"), 10, 64)
		tx := pgxhttp.TxFromContext(ctx)
		own := tx == nil
		if own {
			var err error
			if tx, err = e.pool.Begin(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
		}
		if err := pgxEffect(ctx, tx, upd, ins, httpOrder{Customer: cid, Order: oid}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if own {
			if err := tx.Commit(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%d,"points":10}`, oid)
	})
	with := idem.Wrap(handler)
	serve := func(ctx context.Context, h http.Handler, key string, cid, oid int64, replayed bool) error {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders?c="+strconv.FormatInt(cid, 10)+"&o="+strconv.FormatInt(oid, 10), strings.NewReader("{}"))
		if key != "" {
			r.Header.Set(idemhttp.DefaultHeader, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			return fmt.Errorf("pgxhttp: %d %s", w.Code, strings.TrimSpace(w.Body.String()))
		}
		if got := w.Header().Get(idemhttp.ReplayedHeader) == "true"; got != replayed {
			return fmt.Errorf("pgxhttp: replayed %v, want %v", got, replayed)
		}
		return nil
	}
	e.httpBare = func(ctx context.Context) error {
		_, oid, cid := next()
		return serve(ctx, handler, "", cid, oid, false)
	}
	e.httpWith = func(ctx context.Context) error {
		k, oid, cid := next()
		return serve(ctx, with, k, cid, oid, false)
	}
	replayKey, oid, cid := next()
	if err := serve(ctx, with, replayKey, cid, oid, false); err != nil {
		return err
	}
	e.httpReplay = func(ctx context.Context) error { return serve(ctx, with, replayKey, cid, oid, true) }
	return nil
}
