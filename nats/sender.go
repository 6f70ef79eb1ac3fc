package nats

import (
	"context"
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// A Sender publishes outbox calls to JetStream, for an outbox.Relay (register
// it with outbox.WithSender). Each call is published with the Nats-Msg-Id
// header set to the row's idempotency key, so a relay that publishes again —
// its PubAck was lost, its lease expired mid-call — is dropped by the stream
// as a duplicate, as long as the retry comes within the stream's duplicate
// window (StreamConfig.Duplicates, two minutes by default: keep the relay's
// backoff and lease inside it). Consumers downstream read the same key from
// the header with MsgID, so a publish that got through twice anyway (after
// the window) is still applied once.
//
// Each call also carries its event time in the adapter.EventTimeHeader
// header: the event time of the message whose handler enqueued it
// (outbox.WithEventTime, Message.EventTime), so that a consumer downstream
// claims the published message under the original event time — the same
// day's partition, the same retention fence — however late or often the
// relay sends it. A call enqueued without one carries its row's CreatedAt,
// when the enqueueing transaction began, which is as stable: the same on
// every publish of the row.
//
// A call enqueued with outbox.WithOrder also carries its ordering key and
// sequence in adapter.OrderKeyHeader and adapter.OrderSeqHeader, read by a
// consumer created idempotent.WithOrdering (docs/ordering.md).
type Sender struct {
	js      jetstream.JetStream
	subject func(m outbox.Message) string
	onAck   func(m outbox.Message, ack *jetstream.PubAck)
}

// SenderOption configures a Sender.
type SenderOption func(*Sender) error

// WithPubAck sets a function told of every PubAck the stream returned, for
// logging and tests: ack.Duplicate reports a publish the stream dropped
// because it had stored the same Nats-Msg-Id before. Default is none.
func WithPubAck(f func(m outbox.Message, ack *jetstream.PubAck)) SenderOption {
	return func(s *Sender) error {
		if f == nil {
			return errors.New("nats: WithPubAck: nil function")
		}
		s.onAck = f
		return nil
	}
}

// NewSender returns a Sender that publishes each call's payload to the
// subject subject returns for it (for instance a fixed "orders.completed",
// or one per consumer).
func NewSender(js jetstream.JetStream, subject func(m outbox.Message) string, opts ...SenderOption) (*Sender, error) {
	if js == nil || subject == nil {
		return nil, errors.New("nats: NewSender: nil JetStream or subject function")
	}
	s := &Sender{js: js, subject: subject}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("nats: NewSender: nil option")
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Send publishes m and waits for the stream's PubAck. A duplicate PubAck is
// success: the stream holds the message once. An empty subject is a
// permanent failure; any other error is retried by the relay.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	subj := s.subject(m)
	if subj == "" {
		return outbox.Permanent(fmt.Errorf("nats: no subject for outbox call %d (%s)", m.ID, m.Kind))
	}
	msg := natsgo.NewMsg(subj)
	msg.Data = m.Payload
	msg.Header.Set(jetstream.MsgIDHeader, m.IdempotencyKey)
	if at := m.StableEventTime(); !at.IsZero() {
		msg.Header.Set(adapter.EventTimeHeader, adapter.FormatEventTime(at))
	}
	for k, v := range m.Trace {
		msg.Header.Set(k, v)
	}
	if m.OrderKey != "" {
		msg.Header.Set(adapter.OrderKeyHeader, m.OrderKey)
		msg.Header.Set(adapter.OrderSeqHeader, adapter.FormatOrderSeq(m.OrderSeq))
	}
	ack, err := s.js.PublishMsg(ctx, msg)
	if err != nil {
		// No stream answering is retried too: in a cluster electing a
		// leader it is a passing state. The relay marks the row dead after
		// its maximum number of attempts.
		return fmt.Errorf("nats: publish outbox call %d to %q: %w", m.ID, subj, err)
	}
	if s.onAck != nil {
		s.onAck(m, ack)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
