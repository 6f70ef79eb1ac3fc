// Command loyalty is the story of the idempotent library in one command.
//
// A loyalty service consumes OrderCompleted events and credits points. The
// demo publishes a few thousand of them and consumes them with several
// workers while the usual faults happen: a consumer process crashes after its
// transaction committed but before its ack left; a connection drops
// mid-stream; a producer publishes an event twice, so two workers get it at
// the same moment; and weeks later someone replays a batch of old events from
// the dead-letter archive. It runs that load twice — once with the naive
// check-then-act consumer, once through the library — and prints an audit.
//
//	go run ./examples/loyalty
//
// The first go run compiles the demo's default build: the library, SQLite
// (modernc.org/sqlite, a C library translated to Go, which is most of the
// wait) and the in-process broker — no other driver or broker client. The
// go command prints nothing while it compiles (go run -v
// ./examples/loyalty names each package); later runs start at once. The
// demo prints its first line as soon as it starts, a progress line per run
// (redrawn on a terminal, every 5 s otherwise), then the audit.
//
// A mode that needs more — -db with Postgres or MySQL, -broker kafka,
// nats, redis or pubsub, -http — says so in one line, builds the demo
// again with the build tags of the parts it needs (loyalty_postgres,
// loyalty_mysql, loyalty_kafka, loyalty_nats, loyalty_redis,
// loyalty_pubsub, loyalty_http; go build, from this directory) and runs
// that. The first build of a part compiles its client, a minute or more;
// the build cache makes the next ones take seconds. go run -tags
// loyalty_kafka,loyalty_postgres ./examples/loyalty -broker kafka builds
// it at once.
//
// With no flags it needs nothing installed: an embedded SQLite database in a
// temporary directory and an in-process broker with RabbitMQ's at-least-once
// redelivery. -db and -amqp run the same scenario on real servers:
//
//	go run ./examples/loyalty -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	    -amqp amqp://guest:guest@127.0.0.1:5672/
//
// -broker kafka runs it on Kafka: an in-process Kafka-protocol cluster
// (franz-go's kfake) by default, a real one with -kafka host:port,…. The
// naive consumer is the usual hand-written franz-go loop that commits offsets
// to Kafka after the database commit; the library's is kafka.NewConsumer,
// which stores each partition's offset in the claim's transaction. As the
// kafka package stores offsets in Postgres only, -broker kafka uses the
// Postgres of -db, or of IDEMPOTENT_POSTGRES_DSN, or the local server
// postgres://postgres@127.0.0.1:5432/test:
//
//	go run ./examples/loyalty -broker kafka
//
// -broker nats runs it on NATS JetStream: the server of -nats, by default the
// local nats-server at nats://127.0.0.1:4222 (with JetStream enabled; the
// demo embeds no server, and ends with one line and exit status 1 when none
// answers). The naive consumer is a hand-written JetStream pull loop that
// acks after the database commit; the library's is nats.NewConsumer, keyed by
// the order id in the body. The nats package is dialect-neutral, so -db works
// as for RabbitMQ (embedded SQLite by default):
//
//	go run ./examples/loyalty -broker nats
//
// -broker redis runs it on Redis Streams: the server of -redis, by default
// the local Redis at redis://127.0.0.1:6379, with a stream and a consumer
// group of the run's own, deleted at the end. The naive consumer is a
// hand-written XREADGROUP/XACK loop that acks after the database commit and
// re-claims (XAUTOCLAIM) what a crashed process left pending; the library's
// is redisstream.NewConsumer, keyed by the order id in the payload. -db works
// as for RabbitMQ:
//
//	go run ./examples/loyalty -broker redis
//
// -broker pubsub runs it on the Go CDK's gocloud.dev/pubsub with its
// in-process driver, mempubsub: one subscription that every consumer
// process receives from, an ack deadline of 2 seconds, nothing to install.
// The naive consumer is a hand-written Receive/Ack loop that acks after
// the database commit; the library's is cdkpubsub.NewConsumer, keyed by the
// order id in the body. -db works as for RabbitMQ:
//
//	go run ./examples/loyalty -broker pubsub
//
// -http runs the story over HTTP instead of a broker: an HTTP API on
// loopback credits each order, POST /credits, and the clients send every
// order with an Idempotency-Key, time out after 100ms and retry with the
// same key. A proxy between them, standing for a load balancer, cuts a
// response after the commit every 250 requests and drops every client
// connection three times, and every 100th request is slowed past the
// client's timeout. The naive side is the same handler without the
// middleware, checking the ledger before it credits; the library's is the
// handler wrapped by idemhttp. -db works as for RabbitMQ:
//
//	go run ./examples/loyalty -http
//
// -ordered tells the story of ordered per key (docs/ordering.md): a ledger
// whose balances never go below zero when each account's events apply in
// order, delivered at least once and in any order to several workers; the
// naive consumer's audit shows effects applied out of order and balances
// below zero, WithOrdering's none (ordered.go):
//
//	go run ./examples/loyalty -ordered
//
// The demo creates its own tables, queues, topics and streams, with random
// names, and drops them when it ends.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	db                 target
	amqpURL            string
	broker             string   // "memory", "rabbitmq", "kafka", "nats", "redis", "pubsub", "sqs" or "mqtt"
	kafkaBrokers       []string // -kafka; nil for the in-process cluster
	natsURL            string   // -nats, or defaultNATS
	redisURL           string   // -redis, or defaultRedis
	sqsEndpoint        string   // -sqs, or defaultSQS
	mqttAddr           string   // -mqtt, or defaultMQTT
	http               bool     // -http: the HTTP API instead of a broker
	ordered            bool     // -ordered: the ledger applied in order (ordered.go)
	brokerDesc         string
	orders             int
	consumers, workers int
	seed               uint64
}

// run is the demo; it returns the exit code: 0, 1 for a failure, 2 for bad
// flags. A run that needs a broker's client or a database's driver this
// build lacks is handed to a build that has them (rebuild.go).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		if tags := missingParts(o); len(tags) > 0 {
			return rebuildAndRun(ctx, tags, args, stdout, stderr)
		}
		err = checkParts(o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "loyalty: %s (see -h)\n", oneLine(err))
		return 2
	}
	if _, err := demo(ctx, o, stdout); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "\nloyalty: interrupted")
			return 130
		}
		fmt.Fprintf(stderr, "loyalty: %s\n", oneLine(err))
		return 1
	}
	return 0
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// demo runs the scenario twice, prints the audit and returns the results.
func demo(ctx context.Context, o options, out io.Writer) ([]result, error) {
	if o.ordered {
		st, err := openStore(ctx, o.db, o.consumers*o.workers+2)
		if err != nil {
			return nil, err
		}
		defer st.cleanup()
		_, err = orderedDemo(ctx, o, st, out)
		return nil, err
	}
	var bs brokerSetup
	if !o.http {
		// Check the broker before anything else runs.
		var err error
		if bs, err = brokers[o.broker].start(ctx, o); err != nil {
			return nil, err
		}
		if bs.close != nil {
			defer bs.close()
		}
	}
	st, err := openStore(ctx, o.db, o.consumers*o.workers+2)
	if err != nil {
		return nil, err
	}
	defer st.cleanup()
	ld := makeLoad(o.orders, o.seed)
	if o.http {
		return httpDemo(ctx, o, st, ld, out)
	}
	f := faults{crashEvery: 250, drops: 3, restart: bs.restart}
	fmt.Fprintf(out, "loyalty: %d OrderCompleted events, %d consumer processes x %d workers\n", ld.orders, o.consumers, o.workers)
	fmt.Fprintf(out, "  database  %s\n  broker    %s\n", st.desc, bs.desc)
	ack := "the ack"
	if o.broker == "kafka" {
		ack = "the offset commit"
	}
	fmt.Fprintf(out, "  faults    a crash after commit, before %s, every %d deliveries; %d connections dropped mid-stream;\n", ack, f.crashEvery, f.drops)
	fmt.Fprintf(out, "            %d events published twice (two workers at once); %d old events replayed \"3 weeks later\"\n\n", ld.twice, len(ld.replay))

	pr := newProgressPrinter(out)
	var results []result
	for _, impl := range []struct {
		name string
		make consumerFunc
	}{{"naive check-then-act", bs.naive}, {"idempotent", bs.library}} {
		consume, credited, err := impl.make(st, ctx, ld.customers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", impl.name, err)
		}
		b, err := bs.newBroker()
		if err != nil {
			return nil, err
		}
		r, err := runScenario(ctx, impl.name, b, consume, credited, ld, f, o.consumers, o.workers, pr.report)
		_ = b.close()
		if err != nil {
			pr.abort()
			return nil, fmt.Errorf("%s run: %w", impl.name, err)
		}
		results = append(results, r)
	}
	printAudit(out, results)
	return results, nil
}
