package main

import (
	"io"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/internal/testenv"
)

// TestOutboxMode runs -outbox on a small backlog and a few messages and
// checks its section's rows.
func TestOutboxMode(t *testing.T) {
	testenv.OpenPostgres(t, 1) // skips (or fails under CI) when there is no server
	var b strings.Builder
	if err := run(strings.Fields("-outbox -outbox-rows 100 -outbox-messages 10 -rounds 1"), &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## Outbox relay\n\nCommand: `go run ./tests/bench -outbox -outbox-rows 100 -outbox-messages 10 -rounds 1`",
		"100 pending rows per run",
		"| relays × concurrency (batch) | relay sessions | table | calls/s, median of 1 (min–max) |",
		"| 1 × 16 (16) | synchronous_commit on | analyzed | ",
		"| 4 × 16 (16) | synchronous_commit off | analyzed | ",
		"| 1 × 64 (64) | synchronous_commit on | never analyzed | ",
		"10 messages at 100 commits per second",
		"| NOTIFY (poll 1s as fallback) | ",
		"| polling every 1s (default) | ",
		"| polling every 100ms | ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestParseOutbox checks -outbox's options and refusals.
func TestParseOutbox(t *testing.T) {
	p, err := parse(strings.Fields("-outbox -rounds 2"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.outbox == nil || p.cleanup != nil || p.partitions != nil {
		t.Fatalf("plan %+v, want -outbox alone", p)
	}
	if *p.outbox != (outboxOptions{rows: 10000, messages: 400, rounds: 2}) {
		t.Errorf("outbox %+v", *p.outbox)
	}
	for _, tc := range []struct{ args, flag string }{
		{"-outbox-rows 100", "-outbox-rows"},
		{"-outbox-messages 10", "-outbox-messages"},
		{"-outbox -outbox-rows 0", "-outbox-rows"},
		{"-outbox -outbox-messages 0", "-outbox-messages"},
		{"-outbox -customers 10", "-customers"},
	} {
		if _, err := parse(strings.Fields(tc.args), io.Discard); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %v, want one naming %s", tc.args, err, tc.flag)
		}
	}
}
