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
	handler := pgxLoyaltyHandler(e.pool, upd, ins)
	with := idem.Wrap(handler)
	serve := func(ctx context.Context, h http.Handler, key string, cid, oid int64, replayed bool) error {
		body := `{"customer":` + strconv.FormatInt(cid, 10) + `,"order":` + strconv.FormatInt(oid, 10) + `}`
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", strings.NewReader(body))
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
	// The replays have a Middleware of their own on the same tables, so
	// that the first requests are measured as in a service of first
	// requests, not in the mix of a head-to-head cell, where replays are
	// half and make the middleware read before claiming (docs/http.md).
	replayIdem, err := pgxhttp.New(m, idemhttp.GlobalScope)
	if err != nil {
		return err
	}
	replays := replayIdem.Wrap(handler)
	replayKey, oid, cid := next()
	if err := serve(ctx, with, replayKey, cid, oid, false); err != nil {
		return err
	}
	e.httpReplay = func(ctx context.Context) error { return serve(ctx, replays, replayKey, cid, oid, true) }
	return nil
}
