package cdkpubsub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	raw "cloud.google.com/go/pubsub/apiv1"
	"cloud.google.com/go/pubsub/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/gcppubsub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/txclaim/idempotent/adapter"
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
	_, h := newFakePubSub(t)
	brokertest.Run(t, h)
}

// newFakePubSub starts a pstest server, closed in Cleanup, and returns it
// with the gcppubsub clients of a loopback gRPC connection to it.
func newFakePubSub(t *testing.T) (*pstest.Server, gcpHarness) {
	t.Helper()
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
	return srv, gcpHarness{pub: pub, sub: sub, ackDeadline: 2}
}

// Through gcppubsub, whose raw Pull never extends an ack deadline, a
// handler that outruns the subscription's deadline (one second) has its
// message delivered again by the service while it runs; the second
// delivery waits on the claim, or finds it, and the effect is applied
// once.
func TestGCPAckDeadlineExpiresMidHandler(t *testing.T) {
	t.Parallel()
	srv, h := newFakePubSub(t)
	h.ackDeadline = 1
	tr := h.Open(t).(*gcpTransport)
	l := newLedger(t)
	rec := testenv.NewRecorder()
	var runs atomic.Int32
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if runs.Add(1) == 1 {
			// Hold the claim until the service has delivered the message
			// again, its ack deadline passed.
			deadline := time.NewTimer(10 * time.Second)
			defer deadline.Stop()
			tick := time.NewTicker(5 * time.Millisecond) // a bounded poll of the fake's state
			defer tick.Stop()
		poll:
			for msgs := srv.Messages(); len(msgs) != 1 || msgs[0].Deliveries < 2; msgs = srv.Messages() {
				select {
				case <-tick.C:
				case <-deadline.C:
					t.Error("the message was not delivered again while its handler ran")
					break poll
				}
			}
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithObserver(rec), cdkpubsub.WithWorkers(2), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 12, CustomerID: 6, Points: 3}
	body, _ := json.Marshal(o)
	if err := tr.Publish(context.Background(), brokertest.Message{Key: o.Key(), Body: body,
		Headers: map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}}); err != nil {
		t.Fatal(err)
	}
	sub := gcppubsub.OpenSubscription(h.sub, gcpProject, tr.name, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sub) }()
	rec.Until(t, 15*time.Second, "applied, and a later delivery a Duplicate", func() bool {
		return rec.Count(adapter.EventApplied, o.Key()) == 1 && rec.Count(adapter.EventDuplicate, o.Key()) >= 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := sub.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	t.Logf("%d deliveries: 1 applied, %d duplicates, %d requeued", srv.Messages()[0].Deliveries,
		rec.Count(adapter.EventDuplicate, o.Key()), rec.Count(adapter.EventRequeued, o.Key()))
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

var minDeadline sync.Once

const gcpProject = "idempotent-test"

type gcpHarness struct {
	pub         *raw.PublisherClient
	sub         *raw.SubscriberClient
	ackDeadline int32 // seconds
}

func (gcpHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, Ordered: true}
}

func (h gcpHarness) Open(t *testing.T) brokertest.Transport {
	ctx := context.Background()
	name := testenv.UniqueName("brokertest")
	if _, err := h.pub.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + gcpProject + "/topics/" + name}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.sub.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/" + gcpProject + "/subscriptions/" + name,
		Topic: "projects/" + gcpProject + "/topics/" + name, AckDeadlineSeconds: h.ackDeadline}); err != nil {
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
	c := &gcpConsumer{tr: tr}
	var err error
	c.c, err = newSuiteConsumer(cfg)
	return c, err
}

// gcpConsumer is a consumer process: a Subscription of its own on the
// scenario's Pub/Sub subscription, and a Run.
type gcpConsumer struct {
	subRun
	tr *gcpTransport
}

func (c *gcpConsumer) Start(context.Context) error {
	c.start(gcppubsub.OpenSubscription(c.tr.h.sub, gcpProject, c.tr.name, nil))
	return nil
}

// Kill shuts the Subscription down at once, as a crash does: from then on
// its acks go nowhere, and the service delivers again what it had not
// acked when the ack deadline passes. It does not wait for the handlers.
func (c *gcpConsumer) Kill() error {
	return c.crash()
}
