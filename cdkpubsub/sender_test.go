package cdkpubsub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/outbox"
)

// memTopic returns a mempubsub topic and a subscription on it, shut down in
// Cleanup.
func memTopic(t *testing.T) (*pubsub.Topic, *pubsub.Subscription) {
	t.Helper()
	topic := mempubsub.NewTopic()
	sub := mempubsub.NewSubscription(topic, time.Minute)
	t.Cleanup(func() {
		_ = sub.Shutdown(context.Background())
		_ = topic.Shutdown(context.Background())
	})
	return topic, sub
}

func receive(t *testing.T, sub *pubsub.Subscription) *pubsub.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := sub.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.Ack()
	return m
}

func TestSenderMetadata(t *testing.T) {
	t.Parallel()
	topic, sub := memTopic(t)
	s, err := cdkpubsub.NewSender(topic, cdkpubsub.WithMetadata(func(m outbox.Message) map[string]string {
		return map[string]string{"DeduplicationId": m.IdempotencyKey, cdkpubsub.DefaultKeyMetadata: "overridden?"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 1, 8, 0, 0, 5, time.UTC)
	at := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		eventTime time.Time
		want      time.Time
	}{
		{"the enqueued event time", at, at},
		{"the row's creation without one", time.Time{}, created},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Send(context.Background(), outbox.Message{ID: 9, Kind: "points", IdempotencyKey: "key-9", Payload: []byte(`{"a":1}`),
				CreatedAt: created, EventTime: tc.eventTime}); err != nil {
				t.Fatal(err)
			}
			m := receive(t, sub)
			if string(m.Body) != `{"a":1}` || m.Metadata[cdkpubsub.DefaultKeyMetadata] != "key-9" || m.Metadata["DeduplicationId"] != "key-9" ||
				m.Metadata[adapter.EventTimeHeader] != adapter.FormatEventTime(tc.want) {
				t.Fatalf("body %q, metadata %v", m.Body, m.Metadata)
			}
		})
	}
}

func TestSenderRejectsBadArguments(t *testing.T) {
	t.Parallel()
	topic, _ := memTopic(t)
	if _, err := cdkpubsub.NewSender(nil); err == nil {
		t.Error("NewSender(nil): no error")
	}
	if _, err := cdkpubsub.NewSender(topic, nil); err == nil {
		t.Error("NewSender with a nil option: no error")
	}
	if _, err := cdkpubsub.NewSender(topic, cdkpubsub.WithMetadata(nil)); err == nil {
		t.Error("WithMetadata(nil): no error")
	}
	err := cdkpubsub.DeadLetterSender(topic).Send(context.Background(), outbox.Message{ID: 3, Payload: []byte(`[1]`)})
	if !errors.Is(err, outbox.ErrPermanent) {
		t.Errorf("DeadLetterSender of a row that is no dead letter: %v, want ErrPermanent", err)
	}
}

// A dead letter's event time is the row's, in place of the original
// metadata's; the rest of the metadata is kept.
func TestDeadLetterSenderReplacesTheEventTime(t *testing.T) {
	t.Parallel()
	topic, sub := memTopic(t)
	at := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC)
	payload := []byte(`{"body":"AAE=","metadata":{"idempotency-key":"k","Idempotent-Event-Time":"not a time"},"loggable_id":"msg #4","error":"poison"}`)
	if err := cdkpubsub.DeadLetterSender(topic).Send(context.Background(), outbox.Message{ID: 4, IdempotencyKey: "dl-4", Payload: payload, EventTime: at}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, sub)
	want := map[string]string{cdkpubsub.DefaultKeyMetadata: "k", adapter.EventTimeHeader: adapter.FormatEventTime(at),
		cdkpubsub.DeadLetterIDMetadata: "dl-4", cdkpubsub.DeadLetterErrorMetadata: "poison", cdkpubsub.DeadLetterSourceMetadata: "msg #4"}
	if string(m.Body) != "\x00\x01" || len(m.Metadata) != len(want) {
		t.Fatalf("body %q, metadata %v", m.Body, m.Metadata)
	}
	for k, v := range want {
		if m.Metadata[k] != v {
			t.Errorf("metadata %q = %q, want %q", k, m.Metadata[k], v)
		}
	}
}

// TestSenderCarriesTheOrder: a row enqueued with outbox.WithOrder is sent
// with its ordering key and sequence in adapter.OrderKeyHeader and
// adapter.OrderSeqHeader, which adapter.ParseOrder reads back; a row
// without one is sent with neither.
func TestSenderCarriesTheOrder(t *testing.T) {
	t.Parallel()
	topic, sub := memTopic(t)
	s, err := cdkpubsub.NewSender(topic)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Send(ctx, outbox.Message{ID: 1, IdempotencyKey: "k1", Payload: []byte(`{}`), OrderKey: "account:42", OrderSeq: 7}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, sub)
	if key, seq, err := adapter.ParseOrder(m.Metadata[adapter.OrderKeyHeader], m.Metadata[adapter.OrderSeqHeader]); err != nil || key != "account:42" || seq != 7 {
		t.Errorf("ordered row: metadata %v: %q, %d, %v", m.Metadata, key, seq, err)
	}
	if err := s.Send(ctx, outbox.Message{ID: 2, IdempotencyKey: "k2", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	m = receive(t, sub)
	if _, ok := m.Metadata[adapter.OrderKeyHeader]; ok {
		t.Errorf("unordered row: metadata %v", m.Metadata)
	}
}
