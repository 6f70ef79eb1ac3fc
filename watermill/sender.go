package watermill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// A Sender publishes the rows an [Outbox] wrote with a Watermill
// publisher, for an outbox.Relay:
//
//	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", idwm.NewSender(pub, "points")))
//
// Each message is published with its UUID and its [KeyMetadata] field set
// to the row's idempotency key, so every publish of the same row — the relay
// retries after a failed or unconfirmed publish — carries the same identity,
// and a consumer downstream with [NewHandler] (keyed by [UUID], the
// default) applies it once. It carries the row's event time
// (outbox.Message.EventTime) in the adapter.EventTimeHeader field, so the
// consumer claims it under that time — the same day's partition and
// retention fence on every re-send; a row stored without one is published
// with the time its transaction wrote it (outbox.Message.CreatedAt), the
// same on every retry too.
//
// A call enqueued with outbox.WithOrder also carries its ordering key and
// sequence in adapter.OrderKeyHeader and adapter.OrderSeqHeader, read by a
// consumer created idempotent.WithOrdering (docs/ordering.md).
type Sender struct {
	pub   message.Publisher
	topic string
}

// NewSender returns a Sender that publishes to topic with pub. It panics if
// pub is nil or topic empty.
func NewSender(pub message.Publisher, topic string) *Sender {
	if pub == nil || topic == "" {
		panic("watermill: NewSender: nil publisher or empty topic")
	}
	return &Sender{pub: pub, topic: topic}
}

// Send publishes the row's message. A row that is not a message an Outbox
// wrote is a permanent failure.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	var e envelope
	if err := json.Unmarshal(m.Payload, &e); err != nil {
		return outbox.Permanent(fmt.Errorf("watermill: outbox row %d is not a message an Outbox wrote: %w", m.ID, err))
	}
	msg := message.NewMessage(m.IdempotencyKey, e.Payload)
	for k, v := range e.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(KeyMetadata, m.IdempotencyKey)
	switch {
	case !m.EventTime.IsZero():
		msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(m.EventTime))
	case msg.Metadata.Get(adapter.EventTimeHeader) == "" && !m.CreatedAt.IsZero():
		msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(m.CreatedAt))
	}
	for k, v := range m.Trace {
		msg.Metadata.Set(k, v)
	}
	if m.OrderKey != "" {
		msg.Metadata.Set(adapter.OrderKeyHeader, m.OrderKey)
		msg.Metadata.Set(adapter.OrderSeqHeader, adapter.FormatOrderSeq(m.OrderSeq))
	}
	msg.SetContext(ctx)
	if err := s.pub.Publish(s.topic, msg); err != nil {
		return fmt.Errorf("watermill: publish outbox row %d to %q: %w", m.ID, s.topic, err)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
