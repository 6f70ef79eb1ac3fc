package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	_ "github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mocks"
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
	credit := func(ctx context.Context, tx *sql.Tx, o orderCompleted) error {
		res, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.TotalCents/100, o.CustomerID)
		if err != nil {
			return err // rolled back, requeued after the requeue delay
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return rabbitmq.Poison(fmt.Errorf("no customer %d", o.CustomerID)) // dead-lettered
		}
		return nil
	}
	// The event time comes from the Idempotent-Event-Time header
	// (adapter.EventTimeHeader) the producer set, if it did.
	handler, err := rabbitmq.Decode(mw, rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id")), rabbitmq.JSON[orderCompleted], credit)
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := rabbitmq.NewConsumer("loyalty.order-completed", handler,
		rabbitmq.WithWorkers(8),
		rabbitmq.WithOnSettle(func(_ context.Context, s rabbitmq.Settlement) {
			if s.Action == rabbitmq.DeadLettered || s.SettleErr != nil {
				slog.Warn("delivery", "action", s.Action, "message_id", s.Delivery.MessageId, "err", s.Err, "settle_err", s.SettleErr)
			}
		}))
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
			return consumer.Run(ctx, ch) // nil after a graceful shutdown
		}()
		if err != nil {
			slog.Error("consumer stopped; reconnecting", "err", err) // errors.Is(err, rabbitmq.ErrChannelClosed)
			time.Sleep(time.Second)
		}
	}
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
	fmt.Println(errors.Is(err, rabbitmq.ErrNoKey), rabbitmq.IsPoison(err))
	// Output:
	// evt-5f1c <nil>
	// evt-5f1c <nil>
	// order-completed:9912 <nil>
	// true true
}

// More errors can count as poison: here a retention error, for messages
// older than the claims the consumer keeps.
func ExampleWithPoison() {
	errTooOld := errors.New("message older than the claim retention")
	h := func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		if time.Since(d.Timestamp) > 30*24*time.Hour {
			return 0, fmt.Errorf("message %s: %w", d.MessageId, errTooOld)
		}
		return idempotent.Applied, nil
	}
	consumer, err := rabbitmq.NewConsumer("orders", h, rabbitmq.WithPoison(func(err error) bool { return errors.Is(err, errTooOld) }))
	if err != nil {
		log.Fatal(err)
	}
	_ = consumer // Run it as in the NewConsumer example
}

// The adapter in partitioned mode: the event time comes from the
// Idempotent-Event-Time header (adapter.EventTimeHeader) the producer set,
// and the claim lands in the event day's partition. A re-send with a new
// AMQP timestamp but the same header meets the same claim. (The database
// is go-sqlmock, scripted by the mocks package.)
func ExampleProcess_partitioned() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(2))
	if err != nil {
		log.Fatal(err)
	}
	credit, err := rabbitmq.Process(mw, rabbitmq.MessageID(), func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + 50 WHERE customer_id = 7")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	at := time.Now().Add(-time.Hour) // set by the producer
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectAppliedAt("order-completed:9912", at) // the claim in at's day
	m.ExpectExec("UPDATE balances SET points = points + 50 WHERE customer_id = 7").WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()

	outcome, err := credit(context.Background(), &amqp.Delivery{
		MessageId: "order-completed:9912",
		Headers:   amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(at)},
	})
	fmt.Println(outcome, err)
	_, err = credit(context.Background(), &amqp.Delivery{MessageId: "order-completed:9913"}) // no header
	fmt.Println(rabbitmq.IsPoison(err), errors.Is(err, rabbitmq.ErrNoEventTime))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// applied <nil>
	// true true
	// <nil>
}
