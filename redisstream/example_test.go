package redisstream_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/redisstream"
)

// OrderCompleted is the example's message.
type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// A consumer of the "orders" stream in the "loyalty" group: each entry's
// points are credited in the transaction that claims its key, and the
// entry is acknowledged only after that transaction committed.
func ExampleNewConsumer() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	credit := func(ctx context.Context, tx *sql.Tx, o OrderCompleted, _ *redisstream.Delivery) error {
		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
		return err
	}
	c, err := redisstream.NewConsumer(mw, redisstream.Decode(redisstream.JSON[OrderCompleted], credit),
		redisstream.WithWorkers(4), redisstream.WithClaimIdle(time.Minute), redisstream.WithMaxDeliveries(20))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	if err := c.Run(ctx, rdb, "orders", "loyalty"); err != nil { // nil after a graceful shutdown
		log.Fatal(err)
	}
}

// A producer adds an entry with the key, the event time and the payload in
// the fields the Consumer reads by default.
func Example_producer() {
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	fields := map[string]any{
		redisstream.DefaultKeyField: "order-completed:9912",
		adapter.EventTimeHeader:     adapter.FormatEventTime(at),
		redisstream.PayloadField:    `{"order_id": 9912, "customer_id": 7, "points": 40}`,
	}
	_ = &redis.XAddArgs{Stream: "orders", Values: fields} // rdb.XAdd(ctx, args)
	fmt.Println(fields[redisstream.DefaultKeyField], fields[adapter.EventTimeHeader])
	// Output: order-completed:9912 2026-12-01T09:30:00Z
}

// Key functions read the key from a field, or from the JSON payload, with
// a prefix that keeps message kinds apart.
func ExampleBodyField() {
	d := &redisstream.Delivery{Stream: "orders", ID: "1796117400000-0", Count: 1, Values: map[string]string{
		redisstream.PayloadField: `{"order": {"id": 9912}}`,
	}}
	key, err := redisstream.Prefixed("order-completed:", redisstream.BodyField("order", "id"))(d)
	fmt.Println(key, err)
	_, err = redisstream.Field(redisstream.DefaultKeyField)(d)
	fmt.Println(err)
	// Output:
	// order-completed:9912 <nil>
	// idempotent: invalid message key: the message carries no key: no "idempotency_key" header
}

// The time in an entry's id is when Redis added it: a second XADD of the
// same message gets a later one, so it is the event time only with
// WithTransportEventTime, which a partitioned claim table refuses.
func ExampleDelivery_Time() {
	d := &redisstream.Delivery{Stream: "orders", ID: "1796117400123-0"}
	fmt.Println(d.Time().Format(time.RFC3339Nano))
	// Output: 2026-12-01T09:30:00.123Z
}

// An outbox relay adds the calls of kind "points_awarded" to the
// "points" stream, each with its idempotency key and event time.
func ExampleNewSender() {
	db, err := sql.Open("postgres", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(db, "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	s, err := redisstream.NewSender(rdb, func(outbox.Message) string { return "points" })
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", s),
		outbox.WithSender(redisstream.DeadLetterKind, redisstream.DeadLetterSender(rdb)))
	if err != nil {
		log.Fatal(err)
	}
	_ = relay.Run(context.Background())
}
