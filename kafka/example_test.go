package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

type Payment struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// A consumer that applies each payment once, one transaction per record,
// and dead-letters poison records through the outbox.
func ExampleNewConsumer() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "payments")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(db, "payments")
	if err != nil {
		log.Fatal(err)
	}
	c, err := kafka.NewConsumer(mw,
		kafka.Decode(kafka.JSON[Payment], func(ctx context.Context, tx *sql.Tx, p Payment, _ *kgo.Record) error {
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Account, p.Amount)
			return err
		}),
		kafka.WithKey(kafka.Header(kafka.DefaultKeyHeader)),
		kafka.WithDeadLetter(ob, "payments-dlq"),
		kafka.WithWorkers(8),
	)
	if err != nil {
		log.Fatal(err)
	}
	err = c.Run(ctx, kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments"))
	if err != nil {
		log.Fatal(err)
	}
}

// A batch consumer: the records of one poll for one partition are claimed
// together, up to 500 a transaction, and applied by one set-wise
// statement; a record whose value cannot be decoded is dead-lettered alone.
func ExampleNewBatchConsumer() {
	var mw *idempotent.Middleware // idempotent.New(db, postgres.New(), "payments")
	c, err := kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
		ids := make([]string, 0, len(rs))
		for i, r := range rs {
			p, err := kafka.JSON[Payment](r.Value)
			if err != nil {
				return adapter.PoisonItem(i, err) // dead-letter rs[i], run the rest
			}
			ids = append(ids, p.ID)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO seen (id) SELECT unnest($1::text[])`, ids)
		return err
	}, kafka.WithKey(kafka.CloudEventsID()), kafka.WithBatchSize(500))
	_, _ = c, err
}

// A claim table partitioned by event day needs every record's producer
// event time: a consumer that reads none is refused before any record.
func ExampleNewConsumer_partitioned() {
	db, err := sql.Open("postgres", "postgres://localhost/app") // not connected yet
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "payments", idempotent.WithDailyPartitions(7))
	if err != nil {
		log.Fatal(err)
	}
	h := func(context.Context, *sql.Tx, *kgo.Record) error { return nil }
	_, err = kafka.NewConsumer(mw, h, kafka.WithoutEventTime())
	fmt.Println(errors.Is(err, adapter.ErrNoProducerEventTime))
	_, err = kafka.NewConsumer(mw, h) // the Idempotent-Event-Time header
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}

// Keys and event times are read from the record: here the key from a
// JSON field, prefixed by the message type, and the event time from a
// header of the producer's own.
func ExampleBodyField() {
	r := &kgo.Record{
		Value:   []byte(`{"order_id": 9912, "points": 40}`),
		Headers: []kgo.RecordHeader{{Key: "occurred-at", Value: []byte("2026-12-01T09:30:00Z")}},
	}
	key, err := kafka.Prefixed("order-completed:", kafka.BodyField("order_id"))(r)
	fmt.Println(key, err)
	at, err := kafka.TimeHeader("occurred-at")(r)
	fmt.Println(at, err)
	_, err = kafka.Header(kafka.DefaultKeyHeader)(r)
	fmt.Println(errors.Is(err, adapter.ErrNoKey))
	// Output:
	// order-completed:9912 <nil>
	// 2026-12-01 09:30:00 +0000 UTC <nil>
	// true
}

// The offsets table's DDL, for a migration tool.
func ExampleSchemaSQL() {
	up, down, err := kafka.SchemaSQL("kafka_offsets")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(up)
	fmt.Print(down)
	// Output:
	// -- Offsets table of github.com/txclaim/idempotent/kafka: the next offset to apply
	// -- of each (consumer, topic, partition), advanced in the claim's transaction.
	// CREATE TABLE IF NOT EXISTS "kafka_offsets" (
	// 	consumer    text        NOT NULL,
	// 	topic       text        NOT NULL,
	// 	partition   integer     NOT NULL,
	// 	next_offset bigint      NOT NULL CHECK (next_offset >= 0),
	// 	topic_id    text,
	// 	updated_at  timestamptz NOT NULL DEFAULT now(),
	// 	PRIMARY KEY (consumer, topic, partition)
	// );
	// DROP TABLE IF EXISTS "kafka_offsets";
}

// A consumer for tenants that each have a database of their own, with a
// topic per tenant: each partition's records, claims and offset go to its
// tenant's database.
func ExampleWithTenant() {
	dsns := map[string]string{"acme": "postgres://localhost/acme", "globex": "postgres://localhost/globex"}
	ts, err := idempotent.NewTenants(postgres.New(), "payments", idempotent.TenantsConfig{
		Open: func(_ context.Context, tenant string) (*sql.DB, error) {
			dsn, ok := dsns[tenant]
			if !ok {
				return nil, fmt.Errorf("no tenant %q", tenant)
			}
			return sql.Open("postgres", dsn)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ts.Close()
	c, err := kafka.NewBatchConsumer(nil, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
		return nil // the tenant's effects, through tx
	}, kafka.WithTenant(ts, func(topic string, _ int32) (string, error) {
		tenant, ok := strings.CutPrefix(topic, "payments.")
		if !ok {
			return "", fmt.Errorf("topic %s names no tenant", topic)
		}
		return tenant, nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c != nil)
	// Output: true
}
