package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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
	mw, err := idempotent.New(db, postgres.New(), "loyalty") // the claims of the durable "loyalty"
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	h := idnats.Decode(idnats.JSON[OrderCompleted], func(ctx context.Context, tx *sql.Tx, o OrderCompleted, _ jetstream.Msg) error {
		return credit(ctx, tx, o)
	})
	c, err := idnats.NewConsumer(mw, h, idnats.WithWorkers(4),
		idnats.WithObserver(adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			if e.Type == adapter.EventDeadLettered {
				log.Printf("poison message %s terminated: %v", e.Source, e.Err)
			}
		})))
	if err != nil {
		log.Fatal(err) // a partitioned claim table needs the producer's event time
	}
	switch err := c.Run(ctx, cons); {
	case errors.Is(err, idnats.ErrConnectionClosed), errors.Is(err, idnats.ErrConsumerGone):
		log.Fatalf("consumer stopped: %v", err)
	case err != nil:
		log.Fatal(err)
	}
}

// A batch consumer claims and applies up to 100 messages per transaction;
// a message whose data is no order is terminated alone, and the rest of
// its batch runs again without it.
func ExampleNewBatchConsumer() {
	ctx := context.Background()
	var mw *idempotent.Middleware // created as above
	var cons jetstream.Consumer   // created as above
	c, err := idnats.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error {
		for i, m := range msgs {
			o, err := idnats.JSON[OrderCompleted](m.Data())
			if err != nil {
				return adapter.PoisonItem(i, err)
			}
			if err := credit(ctx, tx, o); err != nil {
				return err
			}
		}
		return nil
	}, idnats.WithBatchSize(100))
	if err != nil {
		log.Fatal(err)
	}
	log.Println(c.Run(ctx, cons))
}

// A Middleware whose claim table is partitioned by event day needs every
// message's event time from its producer: a Consumer that would read none,
// or JetStream's stream time, is refused before any message.
func ExampleNewConsumer_partitioned() {
	db, err := sql.Open("postgres", "postgres://db.invalid/loyalty") // nothing connects
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(7), idempotent.WithRetention(7*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	h := func(context.Context, *sql.Tx, jetstream.Msg) error { return nil }
	_, err = idnats.NewConsumer(mw, h, idnats.WithoutEventTime())
	fmt.Println(errors.Is(err, adapter.ErrNoProducerEventTime))
	_, err = idnats.NewConsumer(mw, h, idnats.WithTransportEventTime())
	fmt.Println(errors.Is(err, adapter.ErrNoProducerEventTime))
	_, err = idnats.NewConsumer(mw, h) // the Idempotent-Event-Time header
	fmt.Println(err)
	// Output:
	// true
	// true
	// <nil>
}

// message is a jetstream.Msg for the examples: data and headers alone.
type message struct {
	jetstream.Msg
	data []byte
	hdr  natsgo.Header
}

func (m message) Data() []byte           { return m.data }
func (m message) Headers() natsgo.Header { return m.hdr }

// The key is a natural key from the data, prefixed by the message type,
// rather than the Nats-Msg-Id a replay tool would assign anew.
func ExampleBodyField() {
	key := idnats.Prefixed("order-completed:", idnats.BodyField("order_id"))
	k, err := key(message{data: []byte(`{"order_id": 9912, "points": 50}`)})
	fmt.Println(k, err)
	_, err = key(message{data: []byte(`{"points": 50}`)})
	fmt.Println(errors.Is(err, adapter.ErrNoKey))
	// Output:
	// order-completed:9912 <nil>
	// true
}

// A producer that sets the event time in a header of its own.
func ExampleTimeHeader() {
	at := idnats.TimeHeader("Order-Placed-At")
	t, err := at(message{hdr: natsgo.Header{"Order-Placed-At": {"2026-12-01T09:30:00Z"}}})
	fmt.Println(t, err)
	_, err = at(message{})
	fmt.Println(errors.Is(err, adapter.ErrNoEventTime))
	// Output:
	// 2026-12-01 09:30:00 +0000 UTC <nil>
	// true
}

// An outbox relay publishes the events a handler enqueued to JetStream,
// with Nats-Msg-Id set to each row's idempotency key and the event time
// the call was enqueued with in the Idempotent-Event-Time header.
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
