package nats_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
)

// TestBrokertest runs the adapters' conformance suite on JetStream: a
// stream and a durable of each scenario's own on the local nats-server,
// per message and in batches.
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, natsHarness{url: testenv.Getenv("IDEMPOTENT_NATS_URL", "nats://127.0.0.1:4222")})
}

type natsHarness struct{ url string }

func (natsHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, LoseAck: true, Kill: true, Restart: true, RequeueDelay: true, RoutesByOrderKey: true}
}

// Open creates a stream and a durable with a 2s AckWait, so that what a
// killed consumer did not ack comes back soon.
func (h natsHarness) Open(t *testing.T) brokertest.Transport {
	js := newJS(t, connect(t, h.url, natsgo.MaxReconnects(0)))
	s, stream := newStream(t, js, 1)
	newConsumer(t, s, "brokertest", 2*time.Second)
	return &natsTransport{t: t, url: h.url, js: js, stream: stream}
}

type natsTransport struct {
	t      *testing.T
	url    string
	js     jetstream.JetStream
	stream string
}

// Publish sends m keyed by the Order-Key header (no Nats-Msg-Id, so the
// stream keeps a re-send as a new message). JetStream stamps its own time.
func (tr *natsTransport) Publish(ctx context.Context, m brokertest.Message) error {
	msg := natsgo.NewMsg(tr.stream + ".orders")
	msg.Data = m.Body
	msg.Header.Set("Order-Key", m.Key)
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	_, err := tr.js.PublishMsg(ctx, msg)
	return err
}

// NewConsumer builds the adapter's consumer of cfg's mode, keyed by the
// Order-Key header, with the event time from the default header.
func (tr *natsTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []idnats.Option{idnats.WithKey(orderKey), idnats.WithWorkers(cfg.Workers), idnats.WithObserver(cfg.Observer),
		idnats.WithFetchWait(50 * time.Millisecond), idnats.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	if cfg.NoEventTime {
		opts = append(opts, idnats.WithoutEventTime())
	}
	c := &natsConsumer{tr: tr, lose: cfg.LoseAck}
	var err error
	if cfg.Batch {
		c.c, err = idnats.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error {
			bodies := make([][]byte, len(msgs))
			for i, m := range msgs {
				bodies[i] = m.Data()
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, idnats.WithBatchSize(cfg.BatchSize))...)
	} else {
		c.c, err = idnats.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, m jetstream.Msg) error {
			return cfg.Handler(ctx, tx, m.Data())
		}, opts...)
	}
	return c, err
}

// natsConsumer is a consumer process: a connection of its own and a Run.
type natsConsumer struct {
	tr     *natsTransport
	c      *idnats.Consumer
	lose   func(key string) bool
	mu     sync.Mutex
	nc     *natsgo.Conn
	run    brokertest.Background
	killed bool
}

func (c *natsConsumer) Start(context.Context) error {
	c.nc = connect(c.tr.t, c.tr.url, natsgo.MaxReconnects(0))
	var cons jetstream.Consumer = bindConsumer(c.tr.t, newJS(c.tr.t, c.nc), c.tr.stream, "brokertest")
	if c.lose != nil {
		// A DoubleAck the suite says to lose naks instead: the server
		// delivers the message again, as after a crash between commit
		// and ack.
		cons = hookedConsumer{Consumer: cons, doubleAck: func(ctx context.Context, m jetstream.Msg) error {
			if c.lose(m.Headers().Get("Order-Key")) {
				return m.Nak()
			}
			return m.DoubleAck(ctx)
		}}
	}
	c.run.Go(func(ctx context.Context) error { return c.c.Run(ctx, cons) })
	return nil
}

func (c *natsConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped, err := c.run.Stop(ctx)
	if !stopped || ctx.Err() != nil {
		return err // nothing ran, or it did not end in time
	}
	c.nc.Close()
	if c.killed {
		return nil
	}
	return err
}

// Kill closes the connection under Run, as a crash does: the acks of
// in-flight messages are lost.
func (c *natsConsumer) Kill() error {
	c.mu.Lock()
	c.killed = true
	c.mu.Unlock()
	c.nc.Close()
	return nil
}

// Unsettled counts the durable's messages not yet delivered (NumPending)
// and delivered and not acked (NumAckPending).
func (tr *natsTransport) Unsettled(ctx context.Context) (int, error) {
	c, err := tr.js.Consumer(ctx, tr.stream, "brokertest")
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

// DeadLetters returns nil: poison is terminated.
func (tr *natsTransport) DeadLetters(context.Context) ([]string, error) { return nil, nil }
