package tests

import (
	"context"
	"database/sql"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/rabbitmq"
)

// The RabbitMQ adapter's tests against the broker are in the rabbitmq
// module (rabbitmq/broker_test.go and beside it). What is left here is the
// loyalty consumer TestOTelRabbitMQContinuesTheProducersTrace runs, which
// needs otelmetrics and rabbitmq together.

// orderHandler is the loyalty consumer's effect as users write it with the
// adapter: the JSON body decoded, the credit in the claim's transaction.
func (l *loyalty) orderHandler() rabbitmq.Handler {
	return rabbitmq.Decode(rabbitmq.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *amqp.Delivery) error {
		return l.credit(ctx, tx, o)
	})
}

// orderConsumer is the loyalty consumer: key from the producer's
// message_id, event time from its Idempotent-Event-Time header (both the
// defaults), orderHandler's credit.
func (l *loyalty) orderConsumer(t testing.TB, opts ...rabbitmq.Option) *rabbitmq.Consumer {
	t.Helper()
	c, err := rabbitmq.NewConsumer(l.mw, l.orderHandler(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runUntil runs c on queue, on a new channel of conn, until cond holds, then shuts it down gracefully and returns Run's
// result.
func runUntil(t *testing.T, c *rabbitmq.Consumer, conn *amqp.Connection, queue, what string, cond func() bool) error {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Run(ctx, ch, queue) }()
	deadline := time.After(60 * time.Second)
	for !cond() {
		select {
		case err := <-res:
			t.Fatalf("Run returned before %s: %v", what, err)
		case <-deadline:
			t.Fatalf("timed out waiting for %s (stats %+v)", what, c.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	return <-res
}
