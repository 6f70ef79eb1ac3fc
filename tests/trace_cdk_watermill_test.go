package tests

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/outbox"
	idwatermill "github.com/txclaim/idempotent/watermill"
)

// TestTraceThroughGoCDK relays with the cdkpubsub package's own Sender,
// which puts the trace context in the message's metadata, twice (a lost
// acknowledgement), to an in-memory topic: the consumer's spans are the
// send span's children, the first applied and the second a duplicate.
// The Go CDK does not tell the adapter which driver or subscription a
// message came from, so the span is "process", of system
// gocloud.dev/pubsub, with no destination.
func TestTraceThroughGoCDK(t *testing.T) {
	t.Parallel()
	r := newTraceRig(t)
	topic := mempubsub.NewTopic()
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	sub := mempubsub.NewSubscription(topic, time.Minute)
	t.Cleanup(func() { _ = sub.Shutdown(context.Background()) })
	sender, err := cdkpubsub.NewSender(topic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cdkpubsub.NewConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		return r.effect(ctx, tx, m.Metadata[cdkpubsub.DefaultKeyMetadata])
	}, cdkpubsub.WithTracer(r.tr), cdkpubsub.WithObserver(r.observer()))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "consumer", func(ctx context.Context) error { return c.Run(ctx, sub) })
	key, req := only(t, r.produce(t, 1))
	r.relay(t, twice(sender.Send))
	if a, d := r.settled(t, 2); a != 1 || d != 1 {
		t.Fatalf("%d applied, %d duplicates; want 1 and 1", a, d)
	}
	r.wantChain(t, req, key, "gocloud.dev/pubsub", "")
}

// TestTraceThroughWatermill publishes each relayed row twice to a Go
// channel Pub/Sub, with the key as the message's UUID and the trace
// context in its metadata, and runs the handler NewHandler returns on each
// message as a router would. A Watermill message does not carry its topic,
// so the span has no destination.
func TestTraceThroughWatermill(t *testing.T) {
	t.Parallel()
	r := newTraceRig(t)
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	const topic = "orders"
	msgs, err := ps.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	h, err := idwatermill.NewHandler(r.mw, func(ctx context.Context, tx *sql.Tx, m *message.Message) error {
		return r.effect(ctx, tx, m.UUID)
	}, idwatermill.WithTracer(r.tr), idwatermill.WithObserver(r.observer()))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "handler", func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case m := <-msgs:
				if err := h(m); err != nil {
					m.Nack()
					return err
				}
				m.Ack()
			}
		}
	})
	key, req := only(t, r.produce(t, 1))
	r.relay(t, twice(func(_ context.Context, m outbox.Message) error {
		msg := message.NewMessage(m.IdempotencyKey, m.Payload)
		for k, v := range m.Trace {
			msg.Metadata.Set(k, v)
		}
		msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(m.CreatedAt))
		return ps.Publish(topic, msg)
	}))
	if a, d := r.settled(t, 2); a != 1 || d != 1 {
		t.Fatalf("%d applied, %d duplicates; want 1 and 1", a, d)
	}
	r.wantChain(t, req, key, "watermill", "")
}
