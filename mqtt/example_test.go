package mqtt_test

import (
	"context"
	"database/sql"
	"log"
	"net"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/outbox"
)

type orderCompleted struct {
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// A consumer group of loyalty processes sharing the orders topics: each
// process runs with a client id of its own, kept across restarts, so that
// what it had not acknowledged when it stopped comes back to it.
func ExampleNewConsumer() {
	var mw *idempotent.Middleware // idempotent.New(db, postgres.New(), "loyalty")
	credit := mqtt.Decode(mqtt.JSON[orderCompleted],
		func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *paho.Publish) error {
			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
			return err
		})
	c, err := mqtt.NewConsumer(mw, credit, mqtt.WithWorkers(4))
	if err != nil {
		log.Fatal(err)
	}
	err = c.Run(context.Background(), mqtt.Session{
		Dial: func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1883")
		},
		ClientID: "loyalty-1",
		Filters:  []string{"$share/loyalty/orders/#"},
		QoS:      1,
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A batch consumer claims up to 100 messages in one transaction.
func ExampleNewBatchConsumer() {
	var mw *idempotent.Middleware
	c, err := mqtt.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, msgs []*paho.Publish) error {
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, "INSERT INTO events (body) VALUES ($1)", m.Payload); err != nil {
				return err
			}
		}
		return nil
	}, mqtt.WithBatchSize(100))
	if err != nil {
		log.Fatal(err)
	}
	_ = c
}

// An outbox relay publishing to MQTT: each row's idempotency key and event
// time travel as user properties, where a consumer downstream reads them.
func ExampleNewSender() {
	var cli *paho.Client // connected; or an autopaho ConnectionManager
	var ob *outbox.Outbox
	s, err := mqtt.NewSender(cli, "orders/completed", mqtt.WithQoS(1))
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender("order-completed", s))
	if err != nil {
		log.Fatal(err)
	}
	_ = relay
}
