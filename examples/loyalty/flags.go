package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The flags are read here, in every build of the demo: the checks need
// nothing but the standard library, so that a mistake is found before a
// build with the mode's clients (rebuild.go) is started. What only a
// client or driver can check (a MySQL DSN, a Redis URL) is checked by its
// mode's check, in the build that has it.

// defaultPostgres is -broker kafka's database when neither -db nor
// IDEMPOTENT_POSTGRES_DSN names one: the kafka package stores partition
// offsets in Postgres only.
const defaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// defaultNATS is -broker nats's server when -nats names none: the local
// nats-server with JetStream.
const defaultNATS = "nats://127.0.0.1:4222"

// defaultRedis is -broker redis's server when -redis names none: the local
// Redis.
const defaultRedis = "redis://127.0.0.1:6379"

// pubsubDesc is -broker pubsub's broker.
const pubsubDesc = "Go CDK pub/sub (gocloud.dev/pubsub, in-process mempubsub, ack deadline 2s)"

func parseFlags(args []string, stdout io.Writer) (options, error) {
	var o options
	var dsn, brokerKind, kafkaAddrs, natsURL, redisURL, sqsEndpoint, mqttAddr string
	fs := flag.NewFlagSet("loyalty", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&dsn, "db", "", "database: a postgres:// URL, a MySQL DSN (user@tcp(host:3306)/db) or sqlite:PATH (default: embedded SQLite in a temporary directory;\nwith -broker kafka, which stores offsets in Postgres: $IDEMPOTENT_POSTGRES_DSN or "+defaultPostgres+")")
	fs.StringVar(&brokerKind, "broker", "rabbitmq", "rabbitmq (the in-process broker, or -amqp), kafka (an in-process Kafka-protocol cluster, or -kafka; needs Postgres),\nnats (the NATS JetStream server of -nats), redis (the Redis of -redis), pubsub (the Go CDK's in-process mempubsub),\nsqs (the Go CDK on the SQS API server of -sqs) or mqtt (the MQTT 5 broker of -mqtt)")
	fs.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL, such as amqp://guest:guest@127.0.0.1:5672/ (default: an in-process broker)")
	fs.StringVar(&kafkaAddrs, "kafka", "", "with -broker kafka: seed brokers host:port,... of a real Kafka cluster (default: an in-process Kafka-protocol cluster, franz-go's kfake)")
	fs.StringVar(&natsURL, "nats", "", "with -broker nats: the NATS server's URL, with JetStream enabled (default "+defaultNATS+")")
	fs.StringVar(&redisURL, "redis", "", "with -broker redis: the Redis server's URL (default "+defaultRedis+")")
	fs.StringVar(&sqsEndpoint, "sqs", "", "with -broker sqs: the SQS API endpoint (default "+defaultSQS+")")
	fs.StringVar(&mqttAddr, "mqtt", "", "with -broker mqtt: the MQTT 5 broker's host:port (default "+defaultMQTT+")")
	fs.BoolVar(&o.http, "http", false, "the HTTP mode: an HTTP API credits the orders, behind a proxy that cuts connections, for clients that time out and retry\nwith the same Idempotency-Key (no broker; -db as for -broker rabbitmq)")
	fs.BoolVar(&o.ordered, "ordered", false, "the ordered mode: a ledger whose balances never go below zero when each account's events apply in order,\ndelivered at least once in any order; the naive consumer against WithOrdering (no broker; -db as for -broker rabbitmq)")
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
		if o.ordered {
			return o, errors.New("-ordered and -http: choose one mode")
		}
		return parseHTTPFlags(fs, o, dsn)
	}
	if o.ordered && (brokerKind != "rabbitmq" || o.amqpURL != "") {
		return o, errors.New("-ordered delivers in process: it takes no -broker or -amqp")
	}
	// Each broker's own flags need that broker.
	for _, bf := range []struct{ flag, value, broker string }{
		{"kafka", kafkaAddrs, "kafka"}, {"nats", natsURL, "nats"}, {"redis", redisURL, "redis"}, {"amqp", o.amqpURL, "rabbitmq"},
		{"sqs", sqsEndpoint, "sqs"}, {"mqtt", mqttAddr, "mqtt"},
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
	case "sqs":
		return parseSQSFlags(o, dsn, sqsEndpoint)
	case "mqtt":
		return parseMQTTFlags(o, dsn, mqttAddr)
	default:
		return o, fmt.Errorf("-broker %q: want rabbitmq, kafka, nats, redis, pubsub, sqs or mqtt", brokerKind)
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

// parseKafkaFlags finishes parseFlags for -broker kafka: seed brokers from
// -kafka, and a Postgres database.
func parseKafkaFlags(o options, dsn, addrs string) (options, error) {
	o.broker = "kafka"
	if addrs != "" {
		for _, a := range strings.Split(addrs, ",") {
			a = strings.TrimSpace(a)
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return o, fmt.Errorf("-kafka %q: want host:port,... (%q is not host:port)", addrs, a)
			}
			o.kafkaBrokers = append(o.kafkaBrokers, a)
		}
	}
	if dsn == "" {
		if dsn = os.Getenv("IDEMPOTENT_POSTGRES_DSN"); dsn == "" {
			dsn = defaultPostgres
		}
	}
	var err error
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	if o.db.kind != "postgres" {
		return o, fmt.Errorf("-db: -broker kafka stores partition offsets in Postgres only: give a postgres:// URL")
	}
	o.brokerDesc = "in-process Kafka-protocol cluster (franz-go's kfake: 3 brokers, consumer groups)"
	if o.kafkaBrokers != nil {
		o.brokerDesc = "Kafka (" + strings.Join(o.kafkaBrokers, ",") + ")"
	}
	return o, nil
}

// parseNatsFlags finishes parseFlags for -broker nats: the server of -nats,
// and the database of -db (the nats package is dialect-neutral).
func parseNatsFlags(o options, dsn, rawURL string) (options, error) {
	o.broker = "nats"
	if rawURL == "" {
		rawURL = defaultNATS
	}
	u, err := brokerURL("nats", rawURL, "nats", "tls")
	if err != nil {
		return o, err
	}
	o.natsURL = rawURL
	o.brokerDesc = "NATS JetStream (" + u.Redacted() + ")"
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}

// parseRedisFlags finishes parseFlags for -broker redis: the server of
// -redis, and the database of -db (the redisstream package is
// dialect-neutral). The Redis client checks the rest of the URL
// (checkRedis).
func parseRedisFlags(o options, dsn, rawURL string) (options, error) {
	o.broker = "redis"
	if rawURL == "" {
		rawURL = defaultRedis
	}
	u, err := brokerURL("redis", rawURL, "redis", "rediss")
	if err != nil {
		return o, err
	}
	o.redisURL = rawURL
	o.brokerDesc = "Redis Streams (" + u.Redacted() + ")"
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}

// brokerURL parses a broker's URL flag, and names what is wrong with it
// without its password.
func brokerURL(name, rawURL string, schemes ...string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("-%s: not a URL: %s (want a %s://host:port URL)", name, urlProblem(err), schemes[0])
	case !contains(schemes, u.Scheme) || u.Host == "":
		return nil, fmt.Errorf("-%s %s: want a %s://host:port URL", name, shownURL(u), schemes[0])
	}
	return u, nil
}

// urlProblem is what url.Parse found wrong, in words that quote no part of
// the URL: its errors quote the URL, or the part of it (a port, an
// escape) that may be a piece of a password.
func urlProblem(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return "it does not parse"
	}
	msg := ue.Err.Error()
	switch {
	case strings.Contains(msg, "invalid port"):
		return "the port after the host is not a number (a password with ':', '/', '?' or '#' is percent-encoded)"
	case strings.Contains(msg, "escape"):
		return "a '%' not followed by two hexadecimal digits (percent-encode a '%' in a password as %25)"
	case strings.Contains(msg, "userinfo"):
		return "the user or password holds a character a URL does not allow there (percent-encode it)"
	}
	return "it does not parse"
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// parsePubsubFlags finishes parseFlags for -broker pubsub: the database of
// -db (the cdkpubsub package is dialect-neutral).
func parsePubsubFlags(o options, dsn string) (options, error) {
	o.broker, o.brokerDesc = "pubsub", pubsubDesc
	var err error
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}

// parseHTTPFlags finishes parseFlags for -http: no broker, and the
// database of -db (idemhttp has response tables for every dialect the demo
// runs on).
func parseHTTPFlags(fs *flag.FlagSet, o options, dsn string) (options, error) {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err == nil && (f.Name == "broker" || f.Name == "amqp" || f.Name == "kafka" || f.Name == "nats" || f.Name == "redis" || f.Name == "sqs" || f.Name == "mqtt") {
			err = fmt.Errorf("-%s is a broker's flag, and -http runs no broker", f.Name)
		}
	})
	if err != nil {
		return o, err
	}
	o.broker, o.brokerDesc = "http", "none: an HTTP API (net/http on loopback) behind a proxy that injects the faults"
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}

// parseAMQP checks -amqp and returns the broker's description, password
// redacted.
func parseAMQP(rawURL string) (string, error) {
	u, err := brokerURL("amqp", rawURL, "amqp", "amqps")
	if err != nil {
		return "", err
	}
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return "", fmt.Errorf("-amqp %s: %w", shownURL(u), err)
	}
	return "RabbitMQ (" + strings.Trim(shownURL(u), `"`) + ")", nil
}

// target is a database named by -db.
type target struct {
	kind string // "sqlite", "postgres" or "mysql": a key of databases
	dsn  string // for the driver; "" for the embedded database
	path string // SQLite's file
	desc string // for the header line, password redacted
}

// dbKind tells which database -db names: "" for an embedded SQLite file in
// a temporary directory, sqlite:PATH, a postgres:// URL, or a MySQL DSN
// (user:pass@tcp(host:3306)/db, optionally prefixed mysql://). Anything
// else is an error that says what it looks like without quoting it: it may
// hold a password the demo cannot find.
func dbKind(dsn string) (string, error) {
	scheme, _, hasScheme := strings.Cut(dsn, "://")
	hasScheme = hasScheme && !strings.ContainsAny(scheme, "@/:= ")
	scheme = strings.ToLower(scheme)
	switch {
	case dsn == "", strings.HasPrefix(dsn, "sqlite:"):
		return "sqlite", nil
	case hasScheme && (scheme == "postgres" || scheme == "postgresql"):
		return "postgres", nil
	case kvStart.MatchString(dsn):
		return "", errors.New("-db: key=value strings are not taken: write a postgres:// URL")
	case hasScheme && scheme == "mysql", !strings.Contains(dsn, "://") && (strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(")):
		return "mysql", nil
	}
	why := "it is none of these"
	switch {
	case hasScheme:
		why = fmt.Sprintf("%s:// is no database the demo knows", scheme)
	case strings.Contains(dsn, "@"):
		why = "user:password@host… without a scheme: write postgres://user:password@host:5432/db, or MySQL's user:password@tcp(host:3306)/db"
	case strings.HasSuffix(dsn, ".db"), strings.HasSuffix(dsn, ".sqlite"), strings.HasSuffix(dsn, ".sqlite3"):
		why = "an SQLite file is written sqlite:PATH"
	}
	return "", fmt.Errorf("-db: want a postgres:// URL, a MySQL DSN such as root@tcp(127.0.0.1:3306)/test, or sqlite:PATH; %s", why)
}

// kvStart matches the start of a key=value connection string.
var kvStart = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// parseDB reads -db. The database's part (sqlite.go, postgres.go,
// mysql.go) checks the rest and describes it; a build without it leaves
// the check to the build that has it (rebuild.go).
func parseDB(dsn string) (target, error) {
	kind, err := dbKind(dsn)
	if err != nil {
		return target{}, err
	}
	if d, ok := databases[kind]; ok {
		return d.parse(dsn)
	}
	return target{kind: kind, dsn: dsn}, nil
}

// shownURL is a URL as a message may show it: quoted, with the password
// of its user information and of its query replaced by xxxxx (a query that
// does not parse is left out).
func shownURL(u *url.URL) string {
	c := *u
	if _, ok := c.User.Password(); ok {
		c.User = url.UserPassword(c.User.Username(), "xxxxx")
	}
	if c.RawQuery != "" {
		q, err := url.ParseQuery(c.RawQuery)
		for k := range q {
			if strings.EqualFold(k, "password") {
				q[k] = []string{"xxxxx"}
			}
		}
		c.RawQuery = q.Encode()
		if err != nil {
			c.RawQuery = "…"
		}
	}
	c.Fragment, c.RawFragment = "", ""
	return fmt.Sprintf("%q", c.String())
}

// shownDSN is a connection string that is no URL as a message may show
// it: quoted, with what stands between its first ':' and its last '@'
// replaced by xxxxx.
func shownDSN(s string) string {
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if user, _, ok := strings.Cut(s[:at], ":"); ok {
			s = user + ":xxxxx" + s[at:]
		}
	}
	return fmt.Sprintf("%q", s)
}
