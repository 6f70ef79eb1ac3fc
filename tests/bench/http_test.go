package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/internal/testenv"
)

// TestHTTPMode runs -http with short cells and checks its section's rows:
// every path answered (each response's status, body and replay header are
// checked as it runs) and every ratio reported.
func TestHTTPMode(t *testing.T) {
	testenv.OpenPostgres(t, 1) // skips (or fails under CI) when there is no server
	var b strings.Builder
	if err := run(strings.Fields("-http -http-workers 2 -rounds 1 -cell 100ms -warmup 20ms"), &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## HTTP: the Idempotency-Key middleware (idemhttp) on a loopback server\n\nCommand: `go run ./tests/bench -http -http-workers 2 -rounds 1 -cell 100ms -warmup 20ms`",
		"; 1 round; 2 workers,",
		"| `database/sql` (lib/pq), without the middleware | ",
		"| `database/sql` (lib/pq), `idemhttp.New` | ",
		"| `database/sql` (lib/pq), replay | ",
		"| pgx, without the middleware | ",
		"| pgx, `pgxhttp.New` (idempgx) | ",
		"| pgx, replay | ",
		"| with/without, `database/sql`: time per request | ",
		"| with/without, pgx: time per request | ",
		"| replay, `database/sql`: times faster than a first request | ",
		"| replay, pgx: times faster than a first request | ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestHTTPReport prints made-up figures and checks the ratios.
func TestHTTPReport(t *testing.T) {
	res := map[string]*httpStats{}
	for i, p := range httpPaths {
		d := time.Duration(i+1) * time.Millisecond
		res[p.name] = &httpStats{alone: []float64{float64(1000 / (i + 1)), float64(1000 / (i + 1))}, lat: []time.Duration{d, d},
			mean: []float64{float64(1000 * (i + 1)), float64(1000 * (i + 1))}}
	}
	res["sql-replay"].mean = []float64{500, 1000} // 2000/500, 2000/1000: 4×, 2×
	var b strings.Builder
	httpReport(&b, "15.20", []string{"-http"}, httpOptions{workers: 8, rounds: 2, cell: time.Second},
		time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), time.Minute, res)
	out := b.String()
	for _, want := range []string{
		"| `database/sql` (lib/pq), without the middleware | 1000 | 1.00 | 1.00 | – | 1.00 |",
		"| `database/sql` (lib/pq), `idemhttp.New` | 500 | 2.00 | 2.00 | 0.50 | 2.00 |",
		"| with/without, `database/sql`: time per request | 2.000×, 2.000× | **2.000×** |",
		"| with/without, pgx: time per request | 1.250×, 1.250× | **1.250×** |",
		"| replay, `database/sql`: times faster than a first request | 4.000×, 2.000× | **3.000×** |",
		"| pgx/`database/sql`, with the middleware: time per request | 2.500×, 2.500× | **2.500×** |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestParseHTTP checks -http's options and refusals.
func TestParseHTTP(t *testing.T) {
	p, err := parse(strings.Fields("-http -rounds 2 -cell 1s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.pgx != nil || p.http == nil {
		t.Fatalf("plan %+v, want -http alone", p)
	}
	if *p.http != (httpOptions{workers: 8, rounds: 2, cell: time.Second, warmup: 100 * time.Millisecond}) {
		t.Errorf("http %+v", *p.http)
	}
	for _, tc := range []struct{ args, flag string }{
		{"-http-workers 4", "-http-workers"},
		{"-http -http-workers 0", "-http-workers"},
		{"-http -http-workers 33", "-http-workers"},
		{"-http -workers 8", "-workers"},
	} {
		if _, err := parse(strings.Fields(tc.args), io.Discard); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %v, want one naming %s", tc.args, err, tc.flag)
		}
	}
}
