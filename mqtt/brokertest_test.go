package mqtt_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
)

// TestBrokertest runs the adapters' conformance suite on Mosquitto, at QoS
// 1 and QoS 2, per message and in batches: a topic of each scenario's own
// and a persistent session subscribed to it before anything is published,
// which every consumer of the scenario resumes (a consumer restarted with
// its client id), so what one left unacknowledged comes to the next.
func TestBrokertest(t *testing.T) {
	addr := brokerAddr(t)
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("QoS%d", qos), func(t *testing.T) {
			brokertest.Run(t, harness{addr: addr, qos: qos})
		})
	}
}

type harness struct {
	addr string
	qos  byte
}

func (harness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, Ordered: true}
}

func (h harness) Open(t *testing.T) brokertest.Transport {
	topic := "idempotent/" + testenv.UniqueName("brokertest")
	clientID := testenv.UniqueName("brokertest")
	openSession(t, h.addr, clientID, topic, h.qos)
	return &transport{h: h, topic: topic, clientID: clientID, pub: connect(t, h.addr, testenv.UniqueName("pub"), 0)}
}

type transport struct {
	h        harness
	topic    string
	clientID string
	pub      *paho.Client
	mu       sync.Mutex // serialises publishes
}

// Publish sends m at the harness's QoS with its key in
// mqtt.DefaultKeyProperty and its headers as user properties.
func (tr *transport) Publish(ctx context.Context, m brokertest.Message) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return publish(ctx, tr.pub, tr.topic, tr.h.qos, m.Key, m.Headers, m.Body)
}

func (tr *transport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []mqtt.Option{mqtt.WithWorkers(cfg.Workers), mqtt.WithObserver(cfg.Observer),
		mqtt.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	if cfg.NoEventTime {
		opts = append(opts, mqtt.WithoutEventTime())
	}
	var c *mqtt.Consumer
	var err error
	if cfg.Batch {
		c, err = mqtt.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, msgs []*paho.Publish) error {
			bodies := make([][]byte, len(msgs))
			for i, m := range msgs {
				bodies[i] = m.Payload
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, mqtt.WithBatchSize(cfg.BatchSize))...)
	} else {
		c, err = mqtt.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, m *paho.Publish) error {
			return cfg.Handler(ctx, tx, m.Payload)
		}, opts...)
	}
	if err != nil {
		return nil, err
	}
	return &consumer{tr: tr, p: newProc(c, tr.h.addr)}, nil
}

// consumer is one consumer process resuming the scenario's session.
type consumer struct {
	tr *transport
	p  *proc
}

func (c *consumer) Start(context.Context) error {
	c.p.start(c.tr.clientID, c.tr.topic, c.tr.h.qos)
	return nil
}

func (c *consumer) Stop(ctx context.Context) error {
	if c.p.cancel == nil {
		return nil
	}
	c.p.cancel()
	select {
	case err, ok := <-c.p.done:
		if ok {
			close(c.p.done)
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill closes the process's connections without DISCONNECT, as a crash
// does: the broker keeps what it had not acknowledged in the session, for
// the next consumer.
func (c *consumer) Kill() error {
	c.p.kill()
	return nil
}
