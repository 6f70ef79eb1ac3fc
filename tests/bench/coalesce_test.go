package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseCoalesce checks -coalesce's flags: defaults, the settings
// given, and the command lines refused.
func TestParseCoalesce(t *testing.T) {
	t.Setenv("IDEMPOTENT_POSTGRES_DSN", "")
	p, err := parse([]string{"-coalesce"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.pgx != nil || p.coalesce == nil {
		t.Fatalf("-coalesce: plan %+v, want -coalesce alone", p)
	}
	if o := p.coalesce; !slices.Equal(o.workers, []int{8, 32}) || !slices.Equal(o.latencies, []time.Duration{0}) ||
		!slices.Equal(o.hot, []float64{0}) || o.rounds != 3 || o.cell != 2*time.Second || o.warmup != 100*time.Millisecond {
		t.Errorf("-coalesce: %+v", *o)
	}

	p, err = parse(strings.Fields("-coalesce -coalesce-workers 4,128 -coalesce-conns 8 -latency 0,1ms -hot 0,0.1 -rounds 2 -cell 1s -pgx"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o := p.coalesce; o == nil || !slices.Equal(o.workers, []int{4, 128}) || o.conns != 8 || o.poolSize(128) != 8 || !slices.Equal(o.latencies, []time.Duration{0, time.Millisecond}) ||
		!slices.Equal(o.hot, []float64{0, 0.1}) || o.rounds != 2 || o.cell != time.Second {
		t.Errorf("-coalesce with settings: %+v", p.coalesce)
	}
	if p.pgx == nil || !slices.Equal(p.pgx.latencies, []time.Duration{0, time.Millisecond}) {
		t.Errorf("-pgx beside -coalesce: %+v, want the same latencies", p.pgx)
	}

	for _, tc := range []struct{ args, flag string }{
		{"-hot 0.1", "-hot"},
		{"-coalesce-workers 8", "-coalesce-workers"},
		{"-coalesce -coalesce-workers 1", "-coalesce-workers"},
		{"-coalesce -coalesce-workers 257", "-coalesce-workers"},
		{"-coalesce-conns 8", "-coalesce-conns"},
		{"-coalesce -coalesce-conns 65", "-coalesce-conns"},
		{"-coalesce-limit x.sh", "-coalesce-limit"},
		{"-coalesce -coalesce-limit /no/such/coalesce-limit.sh", "-coalesce-limit"},
		{"-coalesce -coalesce-workers 8,x", "-coalesce-workers"},
		{"-coalesce -hot 1.5", "-hot"},
		{"-coalesce -hot -0.1", "-hot"},
		{"-coalesce -hot 0.1,0.1", "-hot"},
		{"-coalesce -latency 1ms,1ms", "-latency"},
		{"-coalesce -latency abc", "-latency"},
		{"-coalesce -workers 8", "-workers"},
	} {
		_, err := parse(strings.Fields(tc.args), io.Discard)
		if err == nil {
			t.Errorf("%s: no error", tc.args)
			continue
		}
		if !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %q does not name %s", tc.args, err, tc.flag)
		}
	}
}

// TestParseCeiling reads coalesce-limit.sh's output, and refuses output
// that lacks one of its three figures.
func TestParseCeiling(t *testing.T) {
	out := "clients 8, group of 16\none tx per message                3074 msg/s\n" +
		"group, savepoint per message      4475 msg/s   ratio 1.46\ngroup, no savepoints              6791 msg/s   ratio 2.21\n"
	c, err := parseCeiling(out, 8)
	if err != nil {
		t.Fatal(err)
	}
	if c.clients != 8 || c.one != 3074 || c.sp != 1.46 || c.nosp != 2.21 {
		t.Errorf("ceiling %+v", c)
	}
	if _, err := parseCeiling(strings.Replace(out, "ratio 2.21", "", 1), 8); err == nil {
		t.Error("no error for output without the no-savepoint ratio")
	}
}

// TestCoalesceReport prints made-up cells and checks the rows, the
// retries per message and the targets' verdicts.
func TestCoalesceReport(t *testing.T) {
	res := newCoalesceResult()
	res.rtt[0], res.rtt[time.Millisecond] = 80*time.Microsecond, 2400*time.Microsecond
	rates := map[string]float64{"process": 1000, "coalesce4": 2500, "coalesce8": 2000, "coalesce4sp": 1200, "coalesce8sp": 1500}
	for _, l := range []time.Duration{0, time.Millisecond} {
		for _, h := range []float64{0, 0.1} {
			k := coalesceKey{l, 8, h}
			for name, rate := range rates {
				if h > 0 && name != "process" {
					rate /= 2
				}
				s := res.at(k, name)
				s.msgs, s.elapsed, s.perRoundRate = int64(rate), time.Second, []float64{rate}
				s.lat = []time.Duration{time.Millisecond, 3 * time.Millisecond}
			}
			res.retries[k]["coalesce4"] = int64(rates["coalesce4"] * h)
		}
	}
	res.ceilings[0] = []ceiling{{clients: 8, one: 2000, sp: 1.4, nosp: 2.6}, {clients: 8, one: 3000, sp: 1.5, nosp: 2.5}, {clients: 8, one: 3100, sp: 1.6, nosp: 2.4}}
	var b strings.Builder
	o := coalesceOptions{workers: []int{8}, conns: 8, limit: "coalesce-limit.sh", latencies: []time.Duration{0, time.Millisecond}, hot: []float64{0, 0.1}, rounds: 1, cell: time.Second}
	coalesceReport(&b, "15.20", strings.Fields("-coalesce -latency 0,1ms -hot 0,0.1"), o, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), time.Minute, res)
	out := b.String()
	for _, want := range []string{
		"## Coalesced transactions across latency and hot keys",
		"Command: `go run ./tests/bench -coalesce -latency 0,1ms -hot 0,0.1`",
		"Run 2026-12-01 12:00 UTC, 1m0s; go",
		"| loopback (rtt 80 µs) | 8 | none | (c) ProcessMessage, defaults | 1000 | 3.00 | 3.00 | 1.00 | 1.00 (1.00–1.00) | 0.0000 | 0 |",
		"| loopback (rtt 80 µs) | 8 | none | (g) ProcessMessage, WithCoalescing: up to 4 per tx, 1ms wait | 2500 | 3.00 | 3.00 | 2.50 | 2.50 (2.50–2.50) | 0.0000 | 0 |",
		"| proxy, 1ms each way (rtt 2.40 ms) | 8 | 10% on 5 | (g) ProcessMessage, WithCoalescing: up to 4 per tx, 1ms wait | 1250 | 3.00 | 3.00 | 1.25 | 1.25 (1.25–1.25) | 0.2000 | 0 |",
		"lib/pq, a pool of 8 connections shared by every worker of a setting;",
		"`coalesce-limit.sh 16 8 6` after each round of each network",
		"| loopback (rtt 80 µs) | 8 | 3000 | 1.50× | 2.50× | 1.40 / 2.60, 1.50 / 2.50, 1.60 / 2.40 |",
		"| loopback (rtt 80 µs) | 8 | none | 2.500 (coalesce4) | yes | 1.00 | yes | 1.500 (coalesce8sp) | yes | 1.00 | yes |",
		"| loopback (rtt 80 µs) | 8 | 10% on 5 | 1.250 (coalesce4) | **no** | – | – | 0.750 (coalesce8sp) | **no** | – | – |",
		"| proxy, 1ms each way (rtt 2.40 ms) | 8 | none | 2.500 (coalesce4) | yes | – | – | 1.500 (coalesce8sp) | yes | – | – |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}
