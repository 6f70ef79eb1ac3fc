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
// The first go run compiles the demo and its drivers and brokers' clients
// (SQLite, Postgres, RabbitMQ, Kafka's kfake, NATS, Redis, the Go CDK): on
// a cold build cache that takes a minute or two in which nothing is
// printed, as the go command prints nothing while it compiles; go run -v
// ./examples/loyalty names each package as it is compiled, and later runs
// start at once. The demo itself prints its first line as soon as it
// starts, a progress line per run (redrawn on a terminal, every 5 s
// otherwise), then the audit.
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
	"time"
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
	broker             string   // "memory", "rabbitmq", "kafka", "nats", "redis" or "pubsub"
	kafkaBrokers       []string // -kafka; nil for the in-process cluster
	natsURL            string   // -nats, or defaultNATS
	redisURL           string   // -redis, or defaultRedis
	http               bool     // -http: the HTTP API instead of a broker
	brokerDesc         string
	orders             int
	consumers, workers int
	seed               uint64
}

// run is the demo; it returns the exit code: 0, 1 for a failure, 2 for bad
// flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
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

func parseFlags(args []string, stdout io.Writer) (options, error) {
	var o options
	var dsn, brokerKind, kafkaAddrs, natsURL, redisURL string
	fs := flag.NewFlagSet("loyalty", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&dsn, "db", "", "database: a postgres:// URL, a MySQL DSN (user@tcp(host:3306)/db) or sqlite:PATH (default: embedded SQLite in a temporary directory;\nwith -broker kafka, which stores offsets in Postgres: $IDEMPOTENT_POSTGRES_DSN or "+defaultPostgres+")")
	fs.StringVar(&brokerKind, "broker", "rabbitmq", "rabbitmq (the in-process broker, or -amqp), kafka (an in-process Kafka-protocol cluster, or -kafka; needs Postgres),\nnats (the NATS JetStream server of -nats), redis (the Redis of -redis) or pubsub (the Go CDK's in-process mempubsub)")
	fs.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL, such as amqp://guest:guest@127.0.0.1:5672/ (default: an in-process broker)")
	fs.StringVar(&kafkaAddrs, "kafka", "", "with -broker kafka: seed brokers host:port,... of a real Kafka cluster (default: an in-process Kafka-protocol cluster, franz-go's kfake)")
	fs.StringVar(&natsURL, "nats", "", "with -broker nats: the NATS server's URL, with JetStream enabled (default "+defaultNATS+")")
	fs.StringVar(&redisURL, "redis", "", "with -broker redis: the Redis server's URL (default "+defaultRedis+")")
	fs.BoolVar(&o.http, "http", false, "the HTTP mode: an HTTP API credits the orders, behind a proxy that cuts connections, for clients that time out and retry\nwith the same Idempotency-Key (no broker; -db as for -broker rabbitmq)")
	fs.IntVar(&o.orders, "orders", 3000, "OrderCompleted events to publish, 100 to 100000")
	fs.IntVar(&o.consumers, "consumers", 4, "consumer processes, 2 to 32")
	fs.IntVar(&o.workers, "workers", 2, "workers per consumer process, 1 to 16")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated orders")
	fs.Usage = func() {} // Parse calls it on every error; -h is handled below
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./examples/loyalty [flags]")
			fmt.Fprintln(stdout, "\nRuns the loyalty scenario with the naive consumer and with the idempotent library, and audits both.")
			fmt.Fprintln(stdout, "\nflags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
		}
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.orders < 100 || o.orders > 100000:
		return o, fmt.Errorf("-orders %d: want 100 to 100000", o.orders)
	case o.consumers < 2 || o.consumers > 32:
		return o, fmt.Errorf("-consumers %d: want 2 to 32", o.consumers)
	case o.workers < 1 || o.workers > 16:
		return o, fmt.Errorf("-workers %d: want 1 to 16", o.workers)
	}
	if o.http {
		return parseHTTPFlags(fs, o, dsn)
	}
	// Each broker's own flags need that broker.
	for _, bf := range []struct{ flag, value, broker string }{
		{"kafka", kafkaAddrs, "kafka"}, {"nats", natsURL, "nats"}, {"redis", redisURL, "redis"}, {"amqp", o.amqpURL, "rabbitmq"},
	} {
		if bf.value != "" && brokerKind != bf.broker {
			return o, fmt.Errorf("-%s needs -broker %s", bf.flag, bf.broker)
		}
	}
	var err error
	switch brokerKind {
	case "rabbitmq":
	case "kafka":
		return parseKafkaFlags(o, dsn, kafkaAddrs)
	case "nats":
		return parseNatsFlags(o, dsn, natsURL)
	case "redis":
		return parseRedisFlags(o, dsn, redisURL)
	case "pubsub":
		return parsePubsubFlags(o, dsn)
	default:
		return o, fmt.Errorf("-broker %q: want rabbitmq, kafka, nats, redis or pubsub", brokerKind)
	}
	o.broker = "memory"
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	o.brokerDesc = "in-process broker (at-least-once, RabbitMQ semantics)"
	if o.amqpURL != "" {
		o.broker = "rabbitmq"
		if o.brokerDesc, err = parseAMQP(o.amqpURL); err != nil {
			return o, err
		}
	}
	return o, nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// demo runs the scenario twice, prints the audit and returns the results.
func demo(ctx context.Context, o options, out io.Writer) ([]result, error) {
	newBroker := func() (broker, error) { return newMemBroker(), nil }
	f := faults{crashEvery: 250, drops: 3, restart: 20 * time.Millisecond}
	type impl struct {
		name string
		make func(context.Context, int) (consumeFunc, creditedT, error)
	}
	var st *store
	impls := func() []impl {
		return []impl{{"naive check-then-act", st.naiveRabbit}, {"idempotent", st.libraryRabbit}}
	}
	var cluster *kafkaCluster
	switch o.broker {
	case "kafka":
		// Check the cluster before anything else runs.
		var err error
		if cluster, err = startKafka(ctx, o.kafkaBrokers, o.brokerDesc, o.consumers*o.workers); err != nil {
			return nil, err
		}
		defer cluster.close()
		newBroker = func() (broker, error) { return cluster.newTopic(ctx) }
		impls = func() []impl {
			return []impl{{"naive check-then-act", st.naiveKafka}, {"idempotent", st.libraryKafka}}
		}
		if o.kafkaBrokers != nil {
			f.restart = 200 * time.Millisecond
		}
	case "nats":
		// Check the server before anything else runs.
		srv, err := startNats(ctx, o.natsURL, o.brokerDesc)
		if err != nil {
			return nil, err
		}
		defer srv.close()
		o.brokerDesc = srv.desc
		newBroker = func() (broker, error) { return srv.newStream(ctx) }
		impls = func() []impl {
			return []impl{{"naive check-then-act", st.naiveNats}, {"idempotent", st.libraryNats}}
		}
		f.restart = 200 * time.Millisecond
	case "redis":
		// Check the server before anything else runs.
		srv, err := startRedis(ctx, o.redisURL, o.brokerDesc)
		if err != nil {
			return nil, err
		}
		defer srv.close()
		o.brokerDesc = srv.desc
		newBroker = func() (broker, error) { return srv.newStream(ctx) }
		impls = func() []impl {
			return []impl{{"naive check-then-act", st.naiveRedis}, {"idempotent", st.libraryRedis}}
		}
		f.restart = 200 * time.Millisecond
	case "pubsub":
		newBroker = func() (broker, error) { return newPubsubTopic(), nil }
		impls = func() []impl {
			return []impl{{"naive check-then-act", st.naivePubsub}, {"idempotent", st.libraryPubsub}}
		}
	case "rabbitmq":
		// Check the broker before anything else runs.
		b, err := dialRabbit(o.amqpURL)
		if err != nil {
			return nil, err
		}
		_ = b.close()
		newBroker = func() (broker, error) { return dialRabbit(o.amqpURL) }
		f.restart = 200 * time.Millisecond
	}
	st, err := openStore(ctx, o.db, o.consumers*o.workers+2)
	if err != nil {
		return nil, err
	}
	defer st.cleanup()
	ld := makeLoad(o.orders, o.seed)
	if o.http {
		return demoHTTP(ctx, o, st, ld, out)
	}
	fmt.Fprintf(out, "loyalty: %d OrderCompleted events, %d consumer processes x %d workers\n", ld.orders, o.consumers, o.workers)
	fmt.Fprintf(out, "  database  %s\n  broker    %s\n", st.desc, o.brokerDesc)
	ack := "the ack"
	if o.broker == "kafka" {
		ack = "the offset commit"
	}
	fmt.Fprintf(out, "  faults    a crash after commit, before %s, every %d deliveries; %d connections dropped mid-stream;\n", ack, f.crashEvery, f.drops)
	fmt.Fprintf(out, "            %d events published twice (two workers at once); %d old events replayed \"3 weeks later\"\n\n", ld.twice, len(ld.replay))

	pr := newProgressPrinter(out)
	var results []result
	for _, impl := range impls() {
		consume, credited, err := impl.make(ctx, ld.customers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", impl.name, err)
		}
		b, err := newBroker()
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
