package cdkpubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	raw "cloud.google.com/go/pubsub/apiv1"
	"cloud.google.com/go/pubsub/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/gcppubsub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
)

// TestBrokertestGCP runs the conformance suite through the gcppubsub
// driver (raw Pull, no lease extension) against pstest, Google's
// in-process fake of the Pub/Sub service, per message and in batches: a
// topic and subscription of each scenario's own, with a two-second ack
// deadline, so that what a killed consumer did not ack comes back soon.
func TestBrokertestGCP(t *testing.T) {
	minDeadline.Do(func() { pstest.SetMinAckDeadline(time.Second) })
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	pub, err := gcppubsub.PublisherClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := gcppubsub.SubscriberClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, gcpHarness{pub: pub, sub: sub})
}

var minDeadline sync.Once

const gcpProject = "idempotent-test"

type gcpHarness struct {
	pub *raw.PublisherClient
	sub *raw.SubscriberClient
}

func (gcpHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true}
}

func (h gcpHarness) Open(t *testing.T) brokertest.Transport {
	ctx := context.Background()
	name := testenv.UniqueName("brokertest")
	if _, err := h.pub.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + gcpProject + "/topics/" + name}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.sub.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/" + gcpProject + "/subscriptions/" + name,
		Topic: "projects/" + gcpProject + "/topics/" + name, AckDeadlineSeconds: 2}); err != nil {
		t.Fatal(err)
	}
	topic := gcppubsub.OpenTopic(h.pub, gcpProject, name, nil)
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	return &gcpTransport{h: h, name: name, topic: topic}
}

type gcpTransport struct {
	h     gcpHarness
	name  string
	topic *pubsub.Topic
}

func (tr *gcpTransport) Publish(ctx context.Context, m brokertest.Message) error {
	md := map[string]string{cdkpubsub.DefaultKeyMetadata: m.Key}
	for k, v := range m.Headers {
		md[k] = v
	}
	return tr.topic.Send(ctx, &pubsub.Message{Body: m.Body, Metadata: md})
}

func (tr *gcpTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []cdkpubsub.Option{cdkpubsub.WithWorkers(cfg.Workers), cdkpubsub.WithObserver(cfg.Observer),
		cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	if cfg.NoEventTime {
		opts = append(opts, cdkpubsub.WithoutEventTime())
	}
	c := &gcpConsumer{tr: tr}
	var err error
	if cfg.Batch {
		c.c, err = cdkpubsub.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, msgs []*pubsub.Message) error {
			bodies := make([][]byte, len(msgs))
			for i, m := range msgs {
				bodies[i] = m.Body
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, cdkpubsub.WithBatchSize(cfg.BatchSize))...)
	} else {
		c.c, err = cdkpubsub.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
			return cfg.Handler(ctx, tx, m.Body)
		}, opts...)
	}
	return c, err
}

// gcpConsumer is a consumer process: a Subscription of its own on the
// scenario's Pub/Sub subscription, and a Run.
type gcpConsumer struct {
	tr *gcpTransport
	c  *cdkpubsub.Consumer

	mu     sync.Mutex
	sub    *pubsub.Subscription
	cancel context.CancelFunc
	done   chan error
	killed bool
}

func (c *gcpConsumer) Start(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sub = gcppubsub.OpenSubscription(c.tr.h.sub, gcpProject, c.tr.name, nil)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan error, 1)
	sub := c.sub
	go func() { c.done <- c.c.Run(ctx, sub) }()
	return nil
}

func (c *gcpConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		return nil
	}
	c.cancel()
	var err error
	select {
	case err = <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.done = nil
	if c.killed {
		return nil
	}
	if serr := c.sub.Shutdown(ctx); serr != nil && !errors.Is(serr, context.Canceled) {
		err = errors.Join(err, serr)
	}
	return err
}

// Kill shuts the Subscription down at once, as a crash does: from then on
// its acks go nowhere, and the service delivers again what it had not
// acked when the ack deadline passes. It does not wait for the handlers.
func (c *gcpConsumer) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killed = true
	c.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.sub.Shutdown(ctx)
	return nil
}
