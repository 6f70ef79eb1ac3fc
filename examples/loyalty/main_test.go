package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// demoOrders is the test's load: the real command's in full mode, fewer
// orders with -short.
func demoOrders() string {
	if testing.Short() {
		return "400"
	}
	return "3000"
}

// needParts parses args and skips t when this build lacks a part they
// need (scripts/test builds the demo with every part's tag).
func needParts(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseFlags(args, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if tags := missingParts(o); tags != nil {
		t.Skipf("%v needs a build with -tags %s", args, strings.Join(tags, ","))
	}
	return o
}

// needBroker is needParts that also skips t when the broker does not
// answer, except under CI, where it fails.
func needBroker(t *testing.T, hint string, args ...string) {
	t.Helper()
	o := needParts(t, args...)
	bs, err := brokers[o.broker].start(context.Background(), o)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set: %v", err)
		}
		t.Skipf("%v; %s", err, hint)
	}
	if bs.close != nil {
		bs.close()
	}
}

// checkAudit runs the demo with args and checks the audit: the library
// credits exactly the expected points, the naive consumer more, and every
// fault was injected.
func checkAudit(t *testing.T, args ...string) {
	t.Helper()
	checkAuditOf(t, true, args...)
}

// checkAuditOf is checkAudit; naiveExcess says whether the naive run must
// show an excess, or may by chance not.
func checkAuditOf(t *testing.T, naiveExcess bool, args ...string) {
	t.Helper()
	o := needParts(t, args...)
	var out bytes.Buffer
	results, err := demo(context.Background(), o, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want naive and idempotent", len(results))
	}
	naive, lib := results[0], results[1]
	if lib.excess() != 0 || lib.credited != lib.expected || lib.deadLetters != 0 {
		t.Errorf("library run: credited %d, expected %d (%d dead letters): want exact", lib.credited, lib.expected, lib.deadLetters)
	}
	if naive.excess() < 0 || naiveExcess && naive.excess() == 0 {
		t.Errorf("naive run: excess %d, want > 0 (the faults did not reach the check-then-act gap)", naive.excess())
	}
	for _, r := range results {
		if r.crashes == 0 || r.drops == 0 || r.deliveries <= int64(r.orders) || r.duplicates == 0 {
			t.Errorf("%s run: %d crashes, %d drops, %d deliveries of %d orders, %d duplicates: a fault was not injected",
				r.name, r.crashes, r.drops, r.deliveries, r.orders, r.duplicates)
		}
	}
	for _, want := range []string{"excess points", "points credited", "duplicates detected"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestDemoEmbedded(t *testing.T) {
	checkAudit(t, "-orders", demoOrders())
}

// TestDemoOnServers runs the same scenario on the real Postgres and
// RabbitMQ named by IDEMPOTENT_POSTGRES_DSN and IDEMPOTENT_AMQP_URL, or the
// local servers. It skips when they do not answer, except under CI.
func TestDemoOnServers(t *testing.T) {
	dsn, url := os.Getenv("IDEMPOTENT_POSTGRES_DSN"), os.Getenv("IDEMPOTENT_AMQP_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	o := needParts(t, "-db", dsn, "-amqp", url)
	var unreachable error
	if st, err := openStore(context.Background(), o.db, 1); err != nil {
		unreachable = err
	} else {
		st.cleanup()
	}
	if b, err := dialRabbit(url); err != nil {
		unreachable = errors.Join(unreachable, err)
	} else {
		_ = b.close()
	}
	if unreachable != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set: %v", unreachable)
		}
		t.Skipf("%v; set IDEMPOTENT_POSTGRES_DSN and IDEMPOTENT_AMQP_URL to run the demo on real servers", unreachable)
	}
	checkAudit(t, "-orders", demoOrders(), "-db", dsn, "-amqp", url)
}

// needKafkaDemoDB skips t when the Postgres that -broker kafka uses does not
// answer, except under CI, where it fails.
func needKafkaDemoDB(t *testing.T) {
	t.Helper()
	o := needParts(t, "-broker", "kafka")
	st, err := openStore(context.Background(), o.db, 1)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set: %v", err)
		}
		t.Skipf("%v; set IDEMPOTENT_POSTGRES_DSN to run the Kafka demo", err)
	}
	st.cleanup()
}

// TestDemoKafka runs the scenario with -broker kafka: an in-process kfake
// cluster and the Postgres named by IDEMPOTENT_POSTGRES_DSN, or the local
// server (the kafka package stores offsets in Postgres only). It skips when
// Postgres does not answer, except under CI.
func TestDemoKafka(t *testing.T) {
	needKafkaDemoDB(t)
	// The naive consumer's excess needs two deliveries of one order at
	// the same moment: neighbouring partitions, or a partition's old and
	// new owners after a rebalance. Kafka's timing decides whether that
	// happens in a small run, so only the library's audit is asserted
	// exact (and the naive run's never short).
	checkAuditOf(t, false, "-broker", "kafka", "-orders", "400")
}

// TestDemoNats runs the scenario with -broker nats on the NATS server named
// by IDEMPOTENT_NATS_URL, or the local one, with the embedded SQLite. It
// skips when the server does not answer, except under CI.
func TestDemoNats(t *testing.T) {
	url := os.Getenv("IDEMPOTENT_NATS_URL")
	if url == "" {
		url = defaultNATS
	}
	needBroker(t, "set IDEMPOTENT_NATS_URL to run the NATS demo", "-broker", "nats", "-nats", url)
	// As with Kafka, whether two deliveries of one order meet in the
	// naive consumer's gap in a small run is down to timing: only the
	// library's audit is asserted exact (and the naive run's never short).
	checkAuditOf(t, false, "-broker", "nats", "-nats", url, "-orders", "400")
}

// TestDemoRedis runs the scenario with -broker redis on the Redis named by
// IDEMPOTENT_REDIS_ADDR (host:port), or the local one, with the embedded
// SQLite. It skips when the server does not answer, except under CI.
func TestDemoRedis(t *testing.T) {
	url := defaultRedis
	if addr := os.Getenv("IDEMPOTENT_REDIS_ADDR"); addr != "" {
		url = "redis://" + addr
	}
	needBroker(t, "set IDEMPOTENT_REDIS_ADDR to run the Redis demo", "-broker", "redis", "-redis", url)
	// As with NATS, whether two deliveries of one order meet in the naive
	// consumer's gap in a small run is down to timing: only the library's
	// audit is asserted exact (and the naive run's never short).
	checkAuditOf(t, false, "-broker", "redis", "-redis", url, "-orders", "400")
}

// TestDemoPubsub runs the scenario with -broker pubsub: the Go CDK's
// in-process mempubsub and the embedded SQLite, nothing to install.
func TestDemoPubsub(t *testing.T) {
	// mempubsub hands out what waits in the subscription in no order, so
	// whether the two copies of an order meet in the naive consumer's gap
	// in a small run is down to chance: only the library's audit is
	// asserted exact (and the naive run's never short).
	checkAuditOf(t, false, "-broker", "pubsub", "-orders", "400")
}

// TestDemoHTTP runs the HTTP mode: the API on loopback behind the
// fault-injecting proxy, with the embedded SQLite. The slowed requests
// make the naive handler's excess certain: the client's retry comes while
// the first request is still between its check and its credit.
func TestDemoHTTP(t *testing.T) {
	checkAudit(t, "-http", "-orders", "400")
}

func TestBadFlagsAndServersFailInOneLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"-bogus"}, 2, "flag provided but not defined: -bogus"},
		{"too few orders", []string{"-orders", "5"}, 2, "-orders 5: want 100 to 100000"},
		{"one consumer", []string{"-consumers", "1"}, 2, "-consumers 1"},
		{"no workers", []string{"-workers", "0"}, 2, "-workers 0"},
		{"not a number", []string{"-orders", "many"}, 2, `invalid value "many" for flag -orders`},
		{"argument", []string{"now"}, 2, `unexpected argument "now"`},
		{"unknown database", []string{"-db", "oracle://x"}, 2, `-db: want a postgres:// URL, a MySQL DSN such as root@tcp(127.0.0.1:3306)/test, or sqlite:PATH; oracle:// is no database the demo knows`},
		{"no scheme", []string{"-db", "bob:secret@127.0.0.1:3306/test"}, 2, "user:password@host… without a scheme"},
		{"MySQL, bad port", []string{"-db", "root:secret@tcp(127.0.0.1:notaport)/test"}, 2, "the port is not a number from 1 to 65535"},
		{"Postgres, bad port", []string{"-db", "postgres://bob:secret@127.0.0.1:notaport/test"}, 2, "not a Postgres URL: the port after the host is not a number"},
		{"SQLite in a missing directory", []string{"-db", "sqlite:/nonexistent/loyalty.db"}, 2, `-db "sqlite:/nonexistent/loyalty.db": no directory to create the database file in`},
		{"MariaDB, wrong password", []string{"-db", "root:secret@tcp(127.0.0.1:3306)/test"}, 1, "authentication failed"},
		{"Postgres, no such database", []string{"-db", "postgres://postgres@127.0.0.1:5432/no_such_db?sslmode=disable"}, 1, "no such database"},
		{"in-memory SQLite", []string{"-db", "sqlite::memory:"}, 2, "in-memory database"},
		{"not AMQP", []string{"-amqp", "http://127.0.0.1:5672/"}, 2, "-amqp"},
		{"no database server", []string{"-db", "postgres://u:secret@127.0.0.1:1/x?sslmode=disable"}, 1, "does not answer"},
		{"no broker", []string{"-amqp", "amqp://guest:secret@127.0.0.1:1/"}, 1, "does not answer"},
		{"unknown broker", []string{"-broker", "pulsar"}, 2, `-broker "pulsar": want rabbitmq, kafka, nats, redis, pubsub, sqs or mqtt`},
		{"-kafka without -broker kafka", []string{"-kafka", "127.0.0.1:9092"}, 2, "-kafka needs -broker kafka"},
		{"-amqp with -broker kafka", []string{"-broker", "kafka", "-amqp", "amqp://127.0.0.1/"}, 2, "-amqp needs -broker rabbitmq"},
		{"not host:port", []string{"-broker", "kafka", "-kafka", "127.0.0.1"}, 2, `"127.0.0.1" is not host:port`},
		{"Kafka on SQLite", []string{"-broker", "kafka", "-db", "sqlite:/tmp/x.db"}, 2, "Postgres only"},
		{"Kafka, no database server", []string{"-broker", "kafka", "-db", "postgres://u:secret@127.0.0.1:1/x?sslmode=disable"}, 1, "does not answer"},
		{"-nats without -broker nats", []string{"-nats", "nats://127.0.0.1:4222"}, 2, "-nats needs -broker nats"},
		{"-nats with -broker kafka", []string{"-broker", "kafka", "-nats", "nats://127.0.0.1:4222"}, 2, "-nats needs -broker nats"},
		{"-kafka with -broker nats", []string{"-broker", "nats", "-kafka", "127.0.0.1:9092"}, 2, "-kafka needs -broker kafka"},
		{"-amqp with -broker nats", []string{"-broker", "nats", "-amqp", "amqp://127.0.0.1/"}, 2, "-amqp needs -broker rabbitmq"},
		{"not a NATS URL", []string{"-broker", "nats", "-nats", "http://u:secret@127.0.0.1:4222"}, 2, "want a nats://host:port URL"},
		{"NATS, bad database", []string{"-broker", "nats", "-db", "oracle://x"}, 2, "oracle:// is no database the demo knows"},
		{"no NATS server", []string{"-broker", "nats", "-nats", "nats://u:secret@127.0.0.1:1"}, 1, "NATS JetStream (nats://u:xxxxx@127.0.0.1:1) does not answer"},
		{"-redis without -broker redis", []string{"-redis", "redis://127.0.0.1:6379"}, 2, "-redis needs -broker redis"},
		{"-nats with -broker redis", []string{"-broker", "redis", "-nats", "nats://127.0.0.1:4222"}, 2, "-nats needs -broker nats"},
		{"-amqp with -broker redis", []string{"-broker", "redis", "-amqp", "amqp://127.0.0.1/"}, 2, "-amqp needs -broker rabbitmq"},
		{"not a Redis URL", []string{"-broker", "redis", "-redis", "http://u:secret@127.0.0.1:6379"}, 2, "want a redis://host:port URL"},
		{"Redis, bad database", []string{"-broker", "redis", "-db", "oracle://x"}, 2, "oracle:// is no database the demo knows"},
		{"no Redis server", []string{"-broker", "redis", "-redis", "redis://u:secret@127.0.0.1:1"}, 1, "Redis Streams (redis://u:xxxxx@127.0.0.1:1) does not answer"},
		{"-redis with -broker pubsub", []string{"-broker", "pubsub", "-redis", "redis://127.0.0.1:6379"}, 2, "-redis needs -broker redis"},
		{"pub/sub, bad database", []string{"-broker", "pubsub", "-db", "oracle://x"}, 2, "oracle:// is no database the demo knows"},
		{"pub/sub, no database server", []string{"-broker", "pubsub", "-db", "postgres://u:secret@127.0.0.1:1/x?sslmode=disable"}, 1, "does not answer"},
		{"-http with -broker", []string{"-http", "-broker", "nats"}, 2, "-broker is a broker's flag, and -http runs no broker"},
		{"-http with -amqp", []string{"-http", "-amqp", "amqp://127.0.0.1/"}, 2, "-amqp is a broker's flag"},
		{"-http with -redis", []string{"-http", "-redis", "redis://127.0.0.1:6379"}, 2, "-redis is a broker's flag"},
		{"HTTP, bad database", []string{"-http", "-db", "oracle://x"}, 2, "oracle:// is no database the demo knows"},
		{"HTTP, no database server", []string{"-http", "-db", "postgres://u:secret@127.0.0.1:1/x?sslmode=disable"}, 1, "does not answer"},
		{"no Kafka cluster", []string{"-broker", "kafka", "-kafka", "127.0.0.1:1"}, 1, "Kafka (127.0.0.1:1) does not answer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if o, err := parseFlags(tc.args, new(bytes.Buffer)); err == nil {
				needParts(t, tc.args...)
				_ = o
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stdout, &stderr)
			msg := stderr.String()
			if code != tc.code || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "loyalty: ") {
				t.Fatalf("exit %d, stderr %q: want exit %d and one line containing %q", code, msg, tc.code, tc.want)
			}
			if strings.Contains(msg, "secret") {
				t.Fatalf("stderr %q shows the password", msg)
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout %q, want nothing", stdout.String())
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-orders") || stderr.Len() != 0 {
		t.Fatalf("-h: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
