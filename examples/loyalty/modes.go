package main

import (
	"context"
	"database/sql"
	"io"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// The demo's parts. Its default build, what `go run ./examples/loyalty`
// compiles, holds the scenario, the in-process broker (with RabbitMQ's
// client, whose types it speaks, so -amqp works too) and SQLite: nothing
// more, so that the first run starts after the shortest build. Every other
// broker, the HTTP mode and the Postgres and MySQL drivers are parts of
// their own, each compiled in by its build tag (partTags) and entered in
// the maps below by its file's init (kafka.go, nats.go, redis.go,
// pubsub.go, http.go, postgres.go, mysql.go). A run that needs a part its
// binary lacks builds the demo again with the tags it needs and runs that
// (rebuild.go).

// partTags is the build tag of each part outside the default build, by
// the -broker, mode or database kind it provides.
var partTags = map[string]string{
	"kafka": "loyalty_kafka", "nats": "loyalty_nats", "redis": "loyalty_redis", "pubsub": "loyalty_pubsub",
	"sqs": "loyalty_sqs", "mqtt": "loyalty_mqtt",
	"http": "loyalty_http", "postgres": "loyalty_postgres", "mysql": "loyalty_mysql",
}

// partNames says what each part brings, for the line printed before a
// build.
var partNames = map[string]string{
	"kafka": "Kafka's client (franz-go, kfake)", "nats": "the NATS client", "redis": "the Redis client (go-redis)",
	"pubsub": "the Go CDK's pub/sub", "sqs": "the Go CDK's pub/sub with its SQS driver (AWS SDK v2)",
	"mqtt": "the MQTT 5 client (paho.golang)", "http": "the HTTP middleware (idemhttp)",
	"postgres": "the Postgres driver (lib/pq)", "mysql": "the MySQL driver (go-sql-driver/mysql)",
}

// consumerFunc creates one run's tables and returns its consumer: the
// naive one or the library's, for one broker.
type consumerFunc func(s *store, ctx context.Context, customers int) (consumeFunc, creditedT, error)

// brokerMode is a -broker. check, when set, looks at the broker's flags
// with its own client (parseFlags has checked what the standard library
// can); start checks that the broker answers and prepares the runs.
type brokerMode struct {
	check func(o options) error
	start func(ctx context.Context, o options) (brokerSetup, error)
}

// brokerSetup is a started broker, ready for the scenario's two runs.
type brokerSetup struct {
	desc           string // for the header line, password redacted
	newBroker      func() (broker, error)
	naive, library consumerFunc
	restart        time.Duration // how long a crashed consumer process takes to come back
	close          func()        // nil: nothing to close
}

// brokers are the broker modes compiled in, by -broker name ("memory" is
// the in-process broker, "rabbitmq" a real one named by -amqp).
var brokers = map[string]brokerMode{
	"memory":   {start: startMemory},
	"rabbitmq": {start: startRabbit},
}

// database is a -db kind's driver and dialect.
type database struct {
	// parse checks a -db of its kind and describes it.
	parse func(dsn string) (target, error)
	// open opens the pool without connecting.
	open func(t target) (*sql.DB, dialect.Dialect, error)
	// pingError names what a failed first contact says: the server's
	// refusal of the login or of the database, or no answer.
	pingError func(desc string, err error) error
	// horizon is the horizon table EnsureSchema creates beside a claim
	// table.
	horizon func(claims string) string
}

// databases are the database kinds compiled in.
var databases = map[string]database{"sqlite": sqliteDatabase}

// httpDemo is the HTTP mode (-http), when compiled in.
var httpDemo func(ctx context.Context, o options, st *store, ld load, out io.Writer) ([]result, error)

// compiled reports whether this binary holds the part named name.
func compiled(name string) bool {
	if name == "http" {
		return httpDemo != nil
	}
	_, isBroker := brokers[name]
	_, isDatabase := databases[name]
	return isBroker || isDatabase
}

// missingParts returns the build tags of every part o needs outside the
// default build, or nil when this binary holds them all.
func missingParts(o options) []string {
	need := []string{o.db.kind, o.broker}
	var tags []string
	missing := false
	for _, name := range need {
		if tag, ok := partTags[name]; ok {
			tags = append(tags, tag)
			missing = missing || !compiled(name)
		}
	}
	if !missing {
		return nil
	}
	return tags
}

// checkParts runs the check of o's broker, once its part is compiled in.
func checkParts(o options) error {
	if m, ok := brokers[o.broker]; ok && m.check != nil {
		return m.check(o)
	}
	return nil
}

// startMemory is the in-process broker's mode.
func startMemory(context.Context, options) (brokerSetup, error) {
	return brokerSetup{
		desc:      "in-process broker (at-least-once, RabbitMQ semantics)",
		newBroker: func() (broker, error) { return newMemBroker(), nil },
		naive:     (*store).naiveRabbit, library: (*store).libraryRabbit,
		restart: 20 * time.Millisecond,
	}, nil
}

// startRabbit is a real RabbitMQ's mode (-amqp).
func startRabbit(_ context.Context, o options) (brokerSetup, error) {
	b, err := dialRabbit(o.amqpURL)
	if err != nil {
		return brokerSetup{}, err
	}
	_ = b.close()
	return brokerSetup{
		desc:      o.brokerDesc,
		newBroker: func() (broker, error) { return dialRabbit(o.amqpURL) },
		naive:     (*store).naiveRabbit, library: (*store).libraryRabbit,
		restart: 200 * time.Millisecond,
	}, nil
}
