package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"os/signal"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

func credit(ctx context.Context, tx *sql.Tx, o OrderCompleted) error {
	_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
	return err
}

// A loyalty service consumes the ORDERS stream: each OrderCompleted credits
// points exactly once, keyed by the producer's Nats-Msg-Id.
func ExampleConsumer_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	nc, err := natsgo.Connect(natsgo.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "loyalty",
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idnats.NewMiddleware(db, postgres.New(), cons)
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	h, err := idnats.Decode(mw, idnats.MsgID(), idnats.JSON[OrderCompleted], credit)
	if err != nil {
		log.Fatal(err) // a partitioned claim table needs the producer's event time
	}
	c, err := idnats.NewConsumer(h,
		idnats.WithOnSettle(func(_ context.Context, s idnats.Settlement) {
			if s.Action == idnats.Terminated {
				log.Printf("poison message terminated: %v", s.Err)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	switch err := c.Run(ctx, cons); {
	case errors.Is(err, idnats.ErrConnectionClosed), errors.Is(err, idnats.ErrConsumerGone):
		log.Fatalf("consumer stopped: %v", err)
	case err != nil:
		log.Fatal(err)
	}
}

// A batch consumer claims and applies up to 100 messages per transaction.
func ExampleNewBatchConsumer() {
	ctx := context.Background()
	var db *sql.DB              // opened as above
	var cons jetstream.Consumer // created as above
	mw, err := idnats.NewMiddleware(db, postgres.New(), cons)
	if err != nil {
		log.Fatal(err)
	}
	h, err := idnats.DecodeBatch(mw, nil, idnats.JSON[OrderCompleted], func(ctx context.Context, tx *sql.Tx, orders []OrderCompleted) error {
		for _, o := range orders {
			if err := credit(ctx, tx, o); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idnats.NewBatchConsumer(100, h)
	if err != nil {
		log.Fatal(err)
	}
	log.Println(c.Run(ctx, cons))
}

// An outbox relay publishes the events a handler enqueued to JetStream, with
// Nats-Msg-Id set to each row's idempotency key.
func ExampleNewSender() {
	ctx := context.Background()
	var db *sql.DB             // opened as above
	var js jetstream.JetStream // as above
	ob, err := outbox.New(db, "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	s, err := idnats.NewSender(js, func(m outbox.Message) string { return "POINTS.awarded" })
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", s))
	if err != nil {
		log.Fatal(err)
	}
	log.Println(relay.Run(ctx))
}
