package cdkpubsub_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// OrderCompleted is the loyalty service's message in the examples.
type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// A loyalty service crediting points once per completed order, whatever
// the subscription redelivers: any gocloud.dev/pubsub URL works
// ("gcppubsub://…", "awssqs://…", "azuresb://…", "mem://…").
func ExampleNewConsumer() {
	db, err := sql.Open("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	credit := cdkpubsub.Decode(cdkpubsub.JSON[OrderCompleted], func(ctx context.Context, tx *sql.Tx, o OrderCompleted, _ *pubsub.Message) error {
		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
		return err
	})
	c, err := cdkpubsub.NewConsumer(mw, credit,
		cdkpubsub.WithKey(cdkpubsub.Prefixed("order-completed:", cdkpubsub.BodyField("order_id"))),
		cdkpubsub.WithWorkers(8))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	sub, err := pubsub.OpenSubscription(ctx, "gcppubsub://projects/shop/subscriptions/loyalty")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Shutdown(context.Background()) // after Run: sends the last acks
	if err := c.Run(ctx, sub); err != nil {
		log.Fatal(err)
	}
}

// A batch consumer claims up to 200 received messages in one transaction
// and credits the fresh ones together; each message is acked on its own.
func ExampleNewBatchConsumer() {
	var mw *idempotent.Middleware // as in the NewConsumer example
	c, err := cdkpubsub.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, msgs []*pubsub.Message) error {
		for i, m := range msgs {
			o, err := cdkpubsub.JSON[OrderCompleted](m.Body)
			if err != nil {
				return adapter.PoisonItem(i, err) // dead-letter this one, run the rest
			}
			if _, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID); err != nil {
				return err
			}
		}
		return nil
	}, cdkpubsub.WithBatchSize(200))
	if err != nil {
		log.Fatal(err)
	}
	_ = c
}

// The key a consumer reads by default is the producer's, in the
// idempotency-key metadata; BodyField and Prefixed build one from the body.
func ExampleMetadata() {
	msg := &pubsub.Message{
		Body:     []byte(`{"order_id": 9912, "points": 40}`),
		Metadata: map[string]string{cdkpubsub.DefaultKeyMetadata: "order-completed:9912"},
	}
	k1, _ := cdkpubsub.Metadata(cdkpubsub.DefaultKeyMetadata)(msg)
	k2, _ := cdkpubsub.Prefixed("order-completed:", cdkpubsub.BodyField("order_id"))(msg)
	_, err := cdkpubsub.Metadata("order-id")(msg)
	fmt.Println(k1)
	fmt.Println(k2)
	fmt.Println(err)
	// Output:
	// order-completed:9912
	// order-completed:9912
	// idempotent: invalid message key: the message carries no key: no "order-id" header
}

// An outbox relay publishing calls to a topic: the body is the payload,
// and the metadata carries the idempotency key (the key a consumer
// downstream reads by default) and the original event time.
func ExampleNewSender() {
	ctx := context.Background()
	topic := mempubsub.NewTopic()
	sub := mempubsub.NewSubscription(topic, time.Minute)
	defer sub.Shutdown(ctx)
	defer topic.Shutdown(ctx)

	s, err := cdkpubsub.NewSender(topic)
	if err != nil {
		log.Fatal(err)
	}
	// A Relay calls Send for each row: outbox.NewRelay(ob, outbox.WithSender("points-granted", s)).
	err = s.Send(ctx, outbox.Message{ID: 1, Kind: "points-granted", IdempotencyKey: "3b1f…",
		Payload: []byte(`{"customer_id": 3, "points": 40}`), EventTime: time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)})
	if err != nil {
		log.Fatal(err)
	}
	m, err := sub.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	m.Ack()
	fmt.Println(string(m.Body))
	fmt.Println(m.Metadata[cdkpubsub.DefaultKeyMetadata])
	fmt.Println(m.Metadata[adapter.EventTimeHeader])
	// Output:
	// {"customer_id": 3, "points": 40}
	// 3b1f…
	// 2026-12-01T09:30:00Z
}
