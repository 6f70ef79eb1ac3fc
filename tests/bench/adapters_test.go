package main

import (
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/internal/testenv"
)

// needBroker skips the test (or fails it under CI) when nothing listens at
// the address of rawURL.
func needBroker(t *testing.T, name, rawURL string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		testenv.Unavailable(t, "no %s at %s: %v", name, u.Host, err)
		return
	}
	_ = c.Close()
}

// TestAdaptersMode runs -adapters on a few messages and checks its
// section's rows: every consumer applied them all, with a rate.
func TestAdaptersMode(t *testing.T) {
	testenv.OpenPostgres(t, 1) // skips (or fails under CI) when there is no server
	needBroker(t, "NATS", testenv.Getenv("IDEMPOTENT_NATS_URL", localNATS))
	needBroker(t, "RabbitMQ", testenv.Getenv("IDEMPOTENT_AMQP_URL", localAMQP))
	needBroker(t, "Redis", testenv.Getenv("IDEMPOTENT_REDIS_URL", localRedis))
	var b strings.Builder
	args := "-adapters -adapters-workers 4 -adapters-messages 40 -adapters-coalesce 2 -adapters-conns 2 -rounds 1"
	if err := run(strings.Fields(args), &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## Adapters' per-message consumers against ProcessMessage\n\nCommand: `go run ./tests/bench " + args + "`",
		"on 40 messages published beforehand, 4 workers each",
		"| consumer | msgs/s by round | median msgs/s | ×process in turn | ×process head to head, by round | median |",
		"| " + adapterLabels["process"] + " | ",
		"| " + adapterLabels["nats"] + " | ",
		"| " + adapterLabels["rabbitmq"] + " | ",
		"| " + adapterLabels["kafka"] + " | ",
		"| " + adapterLabels["redisstream"] + " | ",
		"| nats per message ≥ 0.8× ProcessMessage, 4 workers | ",
		"| kafka per message ≥ 0.8× ProcessMessage, 4 workers | ",
		"### The adapters, coalesced\n\nEach consumer again, in the same rounds right after its own cell, per message and on a Middleware `WithCoalescing(Coalescing{Max: 2, Wait: time.Millisecond})`, with the same 4 workers, pool of 2 connections",
		"| consumer | per message, median msgs/s | coalesced, msgs/s by round | median | ×per message | target ≥ 1.5× |",
		"\n| process | ", "\n| nats | ", "\n| rabbitmq | ", "\n| kafka | ", "\n| redisstream | ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestParseAdapters checks -adapters' options and refusals.
func TestParseAdapters(t *testing.T) {
	p, err := parse(strings.Fields("-adapters -adapters-consumers kafka,process -rounds 2"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.loyalty != nil || p.adapters == nil {
		t.Fatalf("plan %+v, want -adapters alone", p)
	}
	if a := p.adapters; a.workers != 4 || a.messages != 2000 || a.coalesce != 0 || a.rounds != 2 || strings.Join(a.only, ",") != "kafka,process" {
		t.Errorf("adapters %+v", *a)
	}
	for _, tc := range []struct{ args, flag string }{
		{"-adapters-workers 2", "-adapters-workers"},
		{"-adapters -adapters-workers 0", "-adapters-workers"},
		{"-adapters -adapters-messages 5", "-adapters-messages"},
		{"-adapters -adapters-coalesce 1", "-adapters-coalesce"},
		{"-adapters-coalesce 4", "-adapters-coalesce"},
		{"-adapters -adapters-conns 8", "-adapters-conns"},
		{"-adapters -adapters-coalesce 4 -adapters-conns 65", "-adapters-conns"},
		{"-adapters -adapters-consumers nats,sqs", "-adapters-consumers"},
		{"-adapters -variants process", "-variants"},
	} {
		if _, err := parse(strings.Fields(tc.args), io.Discard); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: error %v, want one naming %s", tc.args, err, tc.flag)
		}
	}
}
