package rabbitmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/internal/testenv"
)

// The tests against a real broker take it from IDEMPOTENT_AMQP_URL, or
// else the local server at localAMQP, and the database from
// IDEMPOTENT_POSTGRES_DSN (testenv.OpenPostgres). If either does not
// answer they skip, saying how to run them — except when CI is set, where
// they fail.
const localAMQP = "amqp://guest:guest@127.0.0.1:5672/"

var (
	amqpOnce   sync.Once
	amqpAddr   string
	amqpReason string
)

// amqpURL returns the broker's URL, or calls testenv.Unavailable when no
// broker answers.
func amqpURL(t testing.TB) string {
	t.Helper()
	amqpOnce.Do(func() {
		url := testenv.Getenv("IDEMPOTENT_AMQP_URL", localAMQP)
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			amqpReason = fmt.Sprintf("no RabbitMQ at %s: %v; set IDEMPOTENT_AMQP_URL (default %s) to a broker to run the RabbitMQ tests", url, err, localAMQP)
			return
		}
		_ = conn.Close()
		amqpAddr = url
	})
	if amqpAddr == "" {
		testenv.Unavailable(t, "%s", amqpReason)
	}
	return amqpAddr
}

// process is one consumer process's broker connection. crash ends it
// abruptly, as a killed process or a dropped network does: the socket closes
// under the client, with no AMQP close handshake, so the broker requeues
// whatever the process had not acked. (The process's database connections
// live on: a handler in flight finishes its transaction, and its ack fails.)
type process struct {
	conn    *amqp.Connection
	mu      sync.Mutex
	netConn net.Conn
	crashed atomic.Bool
}

func dialProcess(url string) (*process, error) {
	p := &process{}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := amqp.DefaultDial(5*time.Second)(network, addr)
		p.mu.Lock()
		p.netConn = c
		p.mu.Unlock()
		return c, err
	}})
	if err != nil {
		return nil, err
	}
	p.conn = conn
	return p, nil
}

func (p *process) crash() {
	p.crashed.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.netConn.Close()
}

// dialTest opens a connection closed in Cleanup.
func dialTest(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func openChannel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// topology is a test's own queue with a dead-letter exchange and queue.
type topology struct {
	queue, dlx, dlq string
}

// declareTopology declares uniquely named queues and a dead-letter exchange,
// deleted in Cleanup.
func declareTopology(t testing.TB, url string) topology {
	t.Helper()
	conn := dialTest(t, url)
	ch := openChannel(t, conn)
	top := topology{queue: testenv.UniqueName("idem_orders"), dlx: testenv.UniqueName("idem_dlx"), dlq: testenv.UniqueName("idem_dead")}
	if err := ch.ExchangeDeclare(top.dlx, amqp.ExchangeFanout, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(top.dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(top.dlq, "", top.dlx, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(top.queue, false, false, false, false, amqp.Table{"x-dead-letter-exchange": top.dlx}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("delete queues: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("delete queues: %v", err)
			return
		}
		for _, q := range []string{top.queue, top.dlq} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
		if err := ch.ExchangeDelete(top.dlx, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", top.dlx, err)
		}
	})
	return top
}

// depth returns how many messages are ready in queue.
func depth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// publisher publishes with confirms to the test's queue.
type publisher struct {
	ch    *amqp.Channel
	queue string
}

func newPublisher(t testing.TB, conn *amqp.Connection, queue string) *publisher {
	t.Helper()
	ch := openChannel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return &publisher{ch: ch, queue: queue}
}

// publish publishes msgs and waits until the broker has confirmed them all.
func (p *publisher) publish(t testing.TB, msgs ...amqp.Publishing) {
	t.Helper()
	ctx := context.Background()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, true, false, m)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// orderMessage is the order as a producer publishes it: keyed by the
// producer-assigned message_id.
func orderMessage(t testing.TB, o order) amqp.Publishing {
	t.Helper()
	body, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return amqp.Publishing{MessageId: o.Key(), ContentType: "application/json", DeliveryMode: amqp.Transient, Body: body}
}
