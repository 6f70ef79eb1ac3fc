package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseModes checks which modes a command line runs and with what.
func TestParseModes(t *testing.T) {
	t.Setenv("IDEMPOTENT_POSTGRES_DSN", "")
	p, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty == nil || p.kafka != nil || p.pgx != nil || p.growth != nil {
		t.Errorf("no flags: plan %+v, want the loyalty variants alone", p)
	}
	if p.dsn != localDSN {
		t.Errorf("no flags: dsn %q, want %q", p.dsn, localDSN)
	}

	p, err = parse([]string{"-pgx"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.kafka != nil || p.growth != nil || p.pgx == nil {
		t.Fatalf("-pgx: plan %+v, want -pgx alone", p)
	}
	if want := (pgxOptions{workers: 8, rounds: 3, cell: 2 * time.Second, warmup: 100 * time.Millisecond,
		latencies: []time.Duration{0}, allocOps: 1000}); !pgxEqual(*p.pgx, want) {
		t.Errorf("-pgx: %+v, want %+v", *p.pgx, want)
	}

	p, err = parse(strings.Fields("-kafka -pgx -latency 0,250us,1ms -growth 1000000,10000000 -growth-workers 8 -rounds 5 -cell 3s -loyalty -workers 1,8 -dsn postgres://x/y"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty == nil || p.kafka == nil || p.pgx == nil || p.growth == nil {
		t.Fatalf("all modes: plan %+v, want every mode", p)
	}
	if p.dsn != "postgres://x/y" || p.loyalty.dsn != p.dsn {
		t.Errorf("dsn %q, loyalty's %q; want postgres://x/y", p.dsn, p.loyalty.dsn)
	}
	if *p.kafka != (kafkaOptions{rounds: 5, records: 1000}) {
		t.Errorf("kafka %+v", *p.kafka)
	}
	if !slices.Equal(p.pgx.latencies, []time.Duration{0, 250 * time.Microsecond, time.Millisecond}) || p.pgx.rounds != 5 || p.pgx.cell != 3*time.Second {
		t.Errorf("pgx %+v", *p.pgx)
	}
	if g := p.growth; !slices.Equal(g.sizes, []int{1000000, 10000000}) || g.workers != 8 || g.rounds != 5 || g.batch != 1 {
		t.Errorf("growth %+v", *g)
	}
	if !slices.Equal(p.loyalty.workers, []int{1, 8}) || p.loyalty.rounds != 5 {
		t.Errorf("loyalty workers %v, rounds %d", p.loyalty.workers, p.loyalty.rounds)
	}

	// -growth alone takes its workers from the first of -workers.
	p, err = parse(strings.Fields("-growth 1000 -workers 4,8"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.growth.workers != 4 {
		t.Errorf("-growth -workers 4,8: loyalty %v, growth workers %d; want no loyalty, 4", p.loyalty, p.growth.workers)
	}
}

func pgxEqual(a, b pgxOptions) bool {
	return a.workers == b.workers && a.rounds == b.rounds && a.cell == b.cell && a.warmup == b.warmup &&
		slices.Equal(a.latencies, b.latencies) && a.allocOps == b.allocOps
}

// TestParseErrors checks that a bad command line is refused with an error
// naming the flag at fault.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ args, flag string }{
		{"-rounds 0 -kafka", "-rounds"},
		{"-cell 0s -pgx", "-cell"},
		{"-warmup -1s", "-warmup"},
		{"-kafka -kafka-records 5", "-kafka-records"},
		{"-kafka-records 100", "-kafka-records"},
		{"-pgx -latency abc", "-latency"},
		{"-pgx -latency -1ms", "-latency"},
		{"-pgx -latency 1ms,1ms", "-latency"},
		{"-pgx -latency 0,", "-latency"},
		{"-latency 1ms", "-latency"},
		{"-pgx -pgx-workers 1", "-pgx-workers"},
		{"-pgx -pgx-workers 33", "-pgx-workers"},
		{"-pgx-workers 8", "-pgx-workers"},
		{"-pgx -pgx-allocs 0", "-pgx-allocs"},
		{"-ordered -ordered-messages 5", "-ordered-messages"},
		{"-ordered-messages 100", "-ordered-messages"},
		{"-growth 0", "-growth"},
		{"-growth 1000,x", "-growth"},
		{"-growth 1000 -growth-batch 0", "-growth-batch"},
		{"-growth 1000 -growth-workers 0", "-growth-workers"},
		{"-growth 1000 -workers x", "-workers"},
		{"-growth-svg a.svg", "-growth-svg"},
		{"-kafka -drivers pq", "-drivers"},
		{"-pgx -workers 8", "-workers"},
		{"-growth 1000 -growth-workers 8 -workers 8", "-workers"},
		{"-drivers mysql", "-drivers"},
		{"-workers 0", "-workers"},
		{"-variants nope", "-variants"},
		{"-h2h process:process", "-h2h"},
		{"-customers 0", "-customers"},
		{"-kafka extra", "extra"},
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

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 25343: "25,343", 1234567: "1,234,567", -1500: "-1,500"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
