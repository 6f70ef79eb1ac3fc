package kafka_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
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
	c, err := kafka.NewConsumer(db, mw, kafka.Header(kafka.DefaultKeyHeader),
		kafka.Decode(kafka.JSON[Payment], func(ctx context.Context, tx *sql.Tx, p Payment) error {
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Account, p.Amount)
			return err
		}),
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
// together and applied by one set-wise statement.
func ExampleNewBatchConsumer() {
	var db *sql.DB
	var mw *idempotent.Middleware
	c, err := kafka.NewBatchConsumer(db, mw, kafka.CloudEventsID(), func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
		ids := make([]string, 0, len(rs))
		for _, r := range rs {
			p, err := kafka.JSON[Payment](r.Value)
			if err != nil {
				return kafka.PoisonRecord(r, err) // dead-letter r, run the rest
			}
			ids = append(ids, p.ID)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO seen (id) SELECT unnest($1::text[])`, ids)
		return err
	})
	_, _ = c, err
}

// The offsets table's DDL, for a migration tool.
func ExampleSchemaSQL() {
	up, _, err := kafka.SchemaSQL("kafka_offsets")
	if err != nil {
		log.Fatal(err)
	}
	_ = up
}
