package main

import (
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/tests/internal/kafkabench"
)

// TestKafkaReport prints made-up rounds and checks the table's rows, the
// medians and the targets' verdicts.
func TestKafkaReport(t *testing.T) {
	res := &kafkabench.Result{Records: 1000, Rounds: []kafkabench.Round{
		{Handwritten: 2 * time.Second, Record: 2 * time.Second, Batch: 40 * time.Millisecond, H2HHandwritten: 400, H2HRecord: 404, Records: 1000},
		{Handwritten: time.Second, Record: 1250 * time.Millisecond, Batch: 50 * time.Millisecond, H2HHandwritten: 400, H2HRecord: 380, Records: 1000},
		{Handwritten: time.Second, Record: time.Second, Batch: 25 * time.Millisecond, H2HHandwritten: 400, H2HRecord: 396, Records: 1000},
	}}
	var b strings.Builder
	kafkaReport(&b, "15.20", []string{"-kafka", "-rounds", "3"}, time.Date(2026, 11, 30, 22, 9, 0, 0, time.UTC), time.Minute, res)
	out := b.String()
	for _, want := range []string{
		"## Kafka consumer (kafka package)",
		"Command: `go run ./tests/bench -kafka -rounds 3`",
		"Run 2026-11-30 22:09 UTC, 1m0s; go",
		"PostgreSQL 15.20",
		"| 1 | 500 | 500 | 25,000 | 1.00 | 1.010 | 50× |",
		"| 2 | 1,000 | 800 | 20,000 | 0.80 | 0.950 | 25× |",
		"| 3 | 1,000 | 1,000 | 40,000 | 1.00 | 0.990 | 40× |",
		"| median | 1,000 | 800 | 25,000 | 1.00 | **0.990** | **40×** |",
		"| per record within 3% of (b), head to head | 0.990 | yes |",
		"| batch ≥ 10× per record | 40× | yes |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if got := res.RecordPerHandwrittenH2H(); got != 1180.0/1200 {
		t.Errorf("head to head over all rounds %v, want %v", got, 1180.0/1200)
	}
}

// TestPgxReport prints made-up settings and checks the targets' rows.
func TestPgxReport(t *testing.T) {
	mk := func(lat time.Duration, rtt time.Duration, ratio float64) *pgxSetting {
		st := &pgxSetting{latency: lat, rtt: rtt, ratios: map[string][]float64{}, meanA: map[string][]float64{}, meanB: map[string][]float64{},
			alone: map[string][]float64{"process": {2800, 2900}, "handwritten": {2500, 2600}}, allocs: map[string][]float64{}}
		for _, c := range pgxComparisons {
			st.ratios[c.name] = []float64{ratio, ratio + 0.02}
			st.meanA[c.name], st.meanB[c.name] = []float64{100, 100}, []float64{100 * ratio, 100 * (ratio + 0.02)}
		}
		if lat == 0 {
			st.allocs = map[string][]float64{"process": {15, 15}, "handwritten": {19, 19}, "pgx_dup": {3, 3}}
		}
		return st
	}
	settings := []*pgxSetting{mk(0, 64*time.Microsecond, 1.12), mk(time.Millisecond, 2650*time.Microsecond, 1.2)}
	var b strings.Builder
	pgxReport(&b, "15.20", []string{"-pgx", "-latency", "0,1ms"}, pgxOptions{workers: 8, rounds: 2, cell: time.Second, allocOps: 1000},
		time.Date(2026, 11, 30, 22, 10, 0, 0, time.UTC), time.Minute, settings)
	out := b.String()
	for _, want := range []string{
		"## The pgx path (idempgx) and the duplicate pre-check",
		"Command: `go run ./tests/bench -pgx -latency 0,1ms`",
		"; 2 rounds; 8 workers;",
		"| `ProcessMessage` ≥ 1.15× hand-written pgx (BEGIN, claim, effect, COMMIT), head to head | loopback (rtt 64 µs) | 1.120×, 1.140× | **1.130×** | **no** |",
		"| `ProcessMessage` ≥ 1.15× hand-written pgx (BEGIN, claim, effect, COMMIT), head to head | proxy, 1ms each way (rtt 2.65 ms) | 1.200×, 1.220× | **1.210×** | yes |",
		"| allocations/msg of `ProcessMessage` ≤ hand-written pgx + 3 | loopback (rtt 64 µs) | -4.0, -4.0 | **-4.0** (15.0 vs 19.0) | yes |",
		"| `ProcessMessage` alone, msgs/s | loopback (rtt 64 µs) | 2800, 2900 | 2850 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "allocations/msg of `ProcessMessage` ≤ hand-written pgx + 3 | proxy") {
		t.Errorf("allocations reported through the proxy:\n%s", out)
	}
}

// TestTailWriter checks the separator's memory of the last two bytes.
func TestTailWriter(t *testing.T) {
	var b strings.Builder
	w := &tailWriter{w: &b}
	for _, s := range []string{"a", "b\n", "\n", ""} {
		_, _ = w.Write([]byte(s))
	}
	if w.n != 4 || w.tail != [2]byte{'\n', '\n'} || b.String() != "ab\n\n" {
		t.Errorf("n %d, tail %q, written %q", w.n, w.tail, b.String())
	}
}
