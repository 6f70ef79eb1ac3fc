package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	_ "github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The loyalty consumer of the guide: each OrderCompleted credits points
// exactly once, acked after the credit commits, with poison messages
// dead-lettered and a reconnect loop around Run.
func ExampleNewConsumer() {
	ctx := context.Background() // cancel it (on SIGTERM, say) for a graceful shutdown
	db, err := idempotent.OpenGuarded("postgres", "postgres://loyalty@db/loyalty")
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(8) // at least the number of workers
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}

	type orderCompleted struct {
		OrderID    int64 `json:"order_id"`
		CustomerID int64 `json:"customer_id"`
		TotalCents int64 `json:"total_cents"`
	}
	// credit runs only for a new claim, in its transaction.
	credit := func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *amqp.Delivery) error {
		res, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.TotalCents/100, o.CustomerID)
		if err != nil {
			return err // rolled back, requeued after the retry delay
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return adapter.Poison(fmt.Errorf("no customer %d", o.CustomerID)) // dead-lettered
		}
		return nil
	}
	// The key is the order id in the body; the event time comes from the
	// Idempotent-Event-Time header (adapter.EventTimeHeader) the producer
	// set, if it did.
	consumer, err := rabbitmq.NewConsumer(mw, rabbitmq.Decode(rabbitmq.JSON[orderCompleted], credit),
		rabbitmq.WithKey(rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id"))),
		rabbitmq.WithWorkers(8),
		rabbitmq.WithObserver(adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			if e.Type == adapter.EventDeadLettered || e.Type == adapter.EventSettleFailed {
				slog.Warn("delivery", "event", e.Type, "key", e.Message.Key, "source", e.Source, "err", e.Err)
			}
		})))
	if err != nil {
		log.Fatal(err)
	}

	for ctx.Err() == nil {
		err := func() error {
			conn, err := amqp.Dial("amqp://loyalty:secret@rabbitmq:5672/")
			if err != nil {
				return err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			return consumer.Run(ctx, ch, "loyalty.order-completed") // nil after a graceful shutdown
		}()
		if err != nil {
			slog.Error("consumer stopped; reconnecting", "err", err) // errors.Is(err, rabbitmq.ErrChannelClosed)
			time.Sleep(time.Second)
		}
	}
}

// A batch consumer claims what the broker has sent ahead, up to 200
// deliveries, in one transaction, and credits the fresh ones with one
// statement per delivery in it; each delivery is then acked on its own.
func ExampleNewBatchConsumer() {
	db, err := idempotent.OpenGuarded("postgres", "postgres://loyalty@db/loyalty")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	type orderCompleted struct {
		CustomerID int64 `json:"customer_id"`
		TotalCents int64 `json:"total_cents"`
	}
	credit := func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error {
		for i, d := range ds {
			o, err := rabbitmq.JSON[orderCompleted](d.Body)
			if err != nil {
				return adapter.PoisonItem(i, err) // dead-letter this one, claim the rest again
			}
			if _, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.TotalCents/100, o.CustomerID); err != nil {
				return err // the whole batch rolls back and is requeued
			}
		}
		return nil
	}
	consumer, err := rabbitmq.NewBatchConsumer(mw, credit, rabbitmq.WithBatchSize(200), rabbitmq.WithWorkers(2))
	if err != nil {
		log.Fatal(err)
	}
	_ = consumer // Run it as in the NewConsumer example
}

// A message key must be the producer's identity for the message's effect,
// the same on every delivery: the message_id property, a header, or a body
// field. A delivery without one is poison.
func ExampleKeyFunc() {
	d := &amqp.Delivery{
		DeliveryTag: 17, // the broker's, different on every delivery: never a key
		MessageId:   "evt-5f1c",
		Headers:     amqp.Table{"event-id": "evt-5f1c"},
		Body:        []byte(`{"order_id": 9912, "customer_id": 7, "total_cents": 5000}`),
	}
	for _, key := range []rabbitmq.KeyFunc{
		rabbitmq.MessageID(),
		rabbitmq.Header("event-id"),
		rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id")),
	} {
		fmt.Println(key(d))
	}
	_, err := rabbitmq.MessageID()(&amqp.Delivery{Body: d.Body})
	fmt.Println(errors.Is(err, adapter.ErrNoKey), errors.Is(err, idempotent.ErrInvalidKey))
	// Output:
	// evt-5f1c <nil>
	// evt-5f1c <nil>
	// order-completed:9912 <nil>
	// true true
}

// A producer that sets its event time in a header of its own: the
// consumer reads it with TimeHeader.
func ExampleTimeHeader() {
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	d := &amqp.Delivery{MessageId: "order-completed:9912", Headers: amqp.Table{"Completed-At": "2026-12-01T10:30:00+01:00"}}
	got, err := rabbitmq.TimeHeader("Completed-At")(d)
	fmt.Println(got.Equal(at), err)
	_, err = rabbitmq.TimeHeader("Completed-At")(&amqp.Delivery{})
	fmt.Println(errors.Is(err, adapter.ErrNoEventTime))
	// Output:
	// true <nil>
	// true
}
