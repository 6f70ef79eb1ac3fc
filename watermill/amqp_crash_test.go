//go:build !race

// The test below closes a watermill-amqp connection under a running
// subscriber; watermill-amqp v3.0.2's reconnection writes
// ConnectionWrapper.connected without synchronisation, which the race
// detector reports (a race in that library, not in this package). It runs
// in the test runs without -race.

package watermill_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/internal/testenv"
)

// TestAMQPConnectionLostAfterCommitIsDuplicate closes the consumer's AMQP
// connection after the effect committed and before the ack: RabbitMQ
// requeues the unacknowledged message, the subscriber reconnects, and the
// redelivery is a duplicate.
func TestAMQPConnectionLostAfterCommitIsDuplicate(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	topic := amqpQueue(t, url)
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	sub, conn := amqpSubscriber(t, url)
	var crashed atomic.Bool
	crash := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && crashed.CompareAndSwap(false, true) {
				// The connection dies between the commit and the ack.
				_ = conn.Connection().Close()
			}
			return out, err
		}
	}
	var s settled
	r := newRouter(t)
	r.AddMiddleware(s.middleware, crash)
	r.AddConsumerHandler("loyalty", topic, sub, ours(t, l, l.handler(nil)))
	runRouter(t, r)
	o := order{OrderID: 9912, CustomerID: 7, Points: 50}
	if err := amqpPublisher(t, url).Publish(topic, orderMessage(t, o)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the redelivery", func() (bool, error) { return l.counts.Duplicates() == 1, nil })
	if a, d := l.counts.Applied(), l.counts.Duplicates(); a != 1 || d != 1 {
		t.Fatalf("applied %d, duplicates %d: want the first delivery applied and the redelivery a duplicate", a, d)
	}
	l.audit(t, []order{o})
}
