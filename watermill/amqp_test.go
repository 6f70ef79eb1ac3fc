package watermill_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/internal/testenv"
)

func amqpURL(t testing.TB) string {
	t.Helper()
	url := testenv.Getenv("IDEMPOTENT_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, "no RabbitMQ at IDEMPOTENT_AMQP_URL (%s): %v", url, err)
	}
	_ = conn.Close()
	return url
}

// amqpQueue returns a fresh topic — a durable queue of that name on the
// default exchange, declared so that what is published before a
// subscriber starts is kept — deleted in Cleanup.
func amqpQueue(t testing.TB, url string) string {
	t.Helper()
	topic := testenv.UniqueName("idempotent_wm")
	amqpQueueNamed(t, url, topic)
	return topic
}

// amqpQueueNamed declares the durable queue name, as watermill-amqp's
// durable queue config declares it, and deletes it in Cleanup.
func amqpQueueNamed(t testing.TB, url, name string) {
	t.Helper()
	onChannel := func(what string, f func(ch *amqp.Channel) error) error {
		conn, err := amqp.Dial(url)
		if err != nil {
			return fmt.Errorf("%s queue %s: %w", what, name, err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("%s queue %s: %w", what, name, err)
		}
		if err := f(ch); err != nil {
			return fmt.Errorf("%s queue %s: %w", what, name, err)
		}
		return nil
	}
	if err := onChannel("declare", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := onChannel("delete", func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(name, false, false, false)
			return err
		}); err != nil {
			t.Error(err)
		}
	})
}

func amqpConfig(url string) wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(url)
	cfg.Consume.Qos.PrefetchCount = 4
	return cfg
}

// amqpSubscriber returns a subscriber on a connection of its own, closed in
// Cleanup, and that connection.
func amqpSubscriber(t testing.TB, url string) (*wamqp.Subscriber, *wamqp.ConnectionWrapper) {
	t.Helper()
	cfg := amqpConfig(url)
	conn, err := wamqp.NewConnection(cfg.Connection, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wamqp.NewSubscriberWithConnection(cfg, watermill.NopLogger{}, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close(); _ = conn.Close() })
	return sub, conn
}

func amqpPublisher(t testing.TB, url string) *wamqp.Publisher {
	t.Helper()
	pub, err := wamqp.NewPublisher(amqpConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// TestAMQPAuditWithDuplicatesAndFailures sends 2,000 orders, some published
// twice and some failing on their first attempt, through RabbitMQ to two
// competing routers.
func TestAMQPAuditWithDuplicatesAndFailures(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	topic := amqpQueue(t, url)
	l := newLedger(t, testenv.OpenPostgres(t, 6), "loyalty")
	var s settled
	failFirst := ours(t, l, l.handler(func(o order) bool { return o.OrderID%13 == 0 }))
	for range 2 {
		sub, _ := amqpSubscriber(t, url)
		r := newRouter(t)
		r.AddMiddleware(s.middleware)
		r.AddConsumerHandler("loyalty", topic, sub, failFirst)
		runRouter(t, r)
	}
	orders := testenv.MakeOrders(2000)
	msgs := withDuplicates(t, orders)
	if err := amqpPublisher(t, url).Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	waitWhileProgressing(t, time.Minute, "every message acked", s.acked.Load, nil, func() (bool, error) { return s.acked.Load() == int64(len(msgs)), nil })
	t.Logf("%d messages (2000 orders, %d published twice), %d first attempts failed: %d applied, %d duplicates",
		len(msgs), len(msgs)-2000, s.nacked.Load(), l.counts.Applied(), l.counts.Duplicates())
	if l.counts.Applied() != 2000 || l.counts.Duplicates() != int64(len(msgs)-2000) {
		t.Errorf("applied %d, duplicates %d: want 2000 and %d", l.counts.Applied(), l.counts.Duplicates(), len(msgs)-2000)
	}
	l.audit(t, orders)
}
