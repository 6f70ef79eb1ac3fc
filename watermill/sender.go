package watermill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/outbox"
)

// A Sender publishes the messages the middleware wrote to the outbox
// (WithOutbox) with a Watermill publisher, for an outbox.Relay:
//
//	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", idwm.NewSender(pub, "points")))
//
// Each message is published with its UUID and its KeyMetadata field set to
// the row's idempotency key, so every publish of the same row — the relay
// retries after a failed or unconfirmed publish — carries the same identity,
// and a consumer downstream with this middleware applies it once.
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

// Send publishes the row's message. A row that is not a message the
// middleware wrote is a permanent failure.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	var e envelope
	if err := json.Unmarshal(m.Payload, &e); err != nil {
		return outbox.Permanent(fmt.Errorf("watermill: outbox row %d is not a produced message: %w", m.ID, err))
	}
	msg := message.NewMessage(m.IdempotencyKey, e.Payload)
	for k, v := range e.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(KeyMetadata, m.IdempotencyKey)
	msg.SetContext(ctx)
	if err := s.pub.Publish(s.topic, msg); err != nil {
		return fmt.Errorf("watermill: publish outbox row %d to %q: %w", m.ID, s.topic, err)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
