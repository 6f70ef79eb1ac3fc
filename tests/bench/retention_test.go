package main

import (
	"io"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/internal/testenv"
)

// TestRetentionModes runs -cleanup and -partitions on tiny tables and
// checks their sections' rows.
func TestRetentionModes(t *testing.T) {
	testenv.OpenPostgres(t, 1) // skips (or fails under CI) when there is no server
	var b strings.Builder
	if err := run(strings.Fields("-cleanup 200 -partitions 1000 -rounds 1"), &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## Cleanup of expired claims\n\nCommand: `go run ./tests/bench -cleanup 200 -partitions 1000 -rounds 1`",
		"200 expired claims, plus 20 live ones",
		"| `Cleanup`, batches of 10,000 (default) | ",
		"| `Cleanup`, batches of 50,000 | ",
		"| guide's `ctid IN (…)`, batches of 10,000 | ",
		"| one unbatched `DELETE` | ",
		"`Cleanup` (batches of 10,000) vs the guide's `ctid IN (…)` form: ",
		"\n\n## Dropping a day of a partitioned claim table\n\n",
		"1 day of each size alternately",
		"| 10 claims | ",
		"| 1,000 claims | ",
		"Drop of 1,000 claims / drop of 10 claims: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestParseRetention checks -cleanup's and -partitions' options and
// refusals.
func TestParseRetention(t *testing.T) {
	p, err := parse(strings.Fields("-cleanup 1000000 -partitions 1000000 -rounds 5"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.cleanup == nil || p.partitions == nil || p.outbox != nil {
		t.Fatalf("plan %+v, want -cleanup and -partitions alone", p)
	}
	if *p.cleanup != (cleanupOptions{expired: 1000000, live: 100000}) {
		t.Errorf("cleanup %+v", *p.cleanup)
	}
	if *p.partitions != (partitionOptions{small: 10000, big: 1000000, rounds: 5}) {
		t.Errorf("partitions %+v", *p.partitions)
	}
	for _, tc := range []struct{ args, flag string }{
		{"-cleanup 5", "-cleanup"},
		{"-cleanup 0", "-cleanup"},
		{"-partitions 99", "-partitions"},
		{"-cleanup 1000 -drivers pq", "-drivers"},
		{"-partitions 1000 -workers 8", "-workers"},
	} {
		if _, err := parse(strings.Fields(tc.args), io.Discard); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %v, want one naming %s", tc.args, err, tc.flag)
		}
	}
}
