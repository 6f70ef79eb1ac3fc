package cdkpubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// A Sender publishes outbox calls to a gocloud.dev/pubsub Topic, for an
// outbox.Relay (register it with outbox.WithSender). Each call is published
// with its payload as the body and two metadata keys: DefaultKeyMetadata,
// the row's idempotency key — the key a Consumer downstream reads by
// default, so a call the relay publishes twice (its Send failed after the
// service had the message, its lease expired mid-call) is applied once —
// and adapter.EventTimeHeader, the event time of the message whose handler
// enqueued the call (outbox.WithEventTime, Message.EventTime), so that the
// consumer claims it under the original event time however late or often
// the relay sends it. A call enqueued without one carries its row's
// CreatedAt, when the enqueueing transaction began, which is as stable: the
// same on every publish of the row.
//
// Most services keep no memory of what they were sent, so the consumer's
// claim is what drops the repeats. An SQS FIFO queue drops a repeated
// MessageDeduplicationId, but only within five minutes of the first send:
// set it with WithMetadata (awssnssqs reads the "DeduplicationId" and
// "MessageGroupId" metadata keys) to save the consumer some duplicates, never
// instead of the claim — a relay retry after a longer backoff or an expired
// lease comes later than that.
//
// A call enqueued with outbox.WithOrder also carries its ordering key and
// sequence in adapter.OrderKeyHeader and adapter.OrderSeqHeader, read by a
// consumer created idempotent.WithOrdering (docs/ordering.md).
type Sender struct {
	topic *pubsub.Topic
	extra func(m outbox.Message) map[string]string
}

// A SenderOption configures a Sender.
type SenderOption func(*Sender) error

// WithMetadata adds the metadata f returns for each call to the message
// published, such as a driver's own keys — {"DeduplicationId":
// m.IdempotencyKey, "MessageGroupId": …} for an SQS FIFO queue through
// awssnssqs. It cannot replace DefaultKeyMetadata or
// adapter.EventTimeHeader: the Sender sets those last. Default is none.
func WithMetadata(f func(m outbox.Message) map[string]string) SenderOption {
	return func(s *Sender) error {
		if f == nil {
			return errors.New("cdkpubsub: WithMetadata: nil function")
		}
		s.extra = f
		return nil
	}
}

// NewSender returns a Sender that publishes each call's payload to topic.
// The caller keeps topic and shuts it down after the relay has stopped.
func NewSender(topic *pubsub.Topic, opts ...SenderOption) (*Sender, error) {
	if topic == nil {
		return nil, errors.New("cdkpubsub: NewSender: nil topic")
	}
	s := &Sender{topic: topic}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("cdkpubsub: NewSender: nil option")
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Send publishes m and waits until the service has it (Topic.Send). Any
// error is retried by the relay, which marks the row dead after its
// maximum number of attempts.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	md := map[string]string{}
	if s.extra != nil {
		maps.Copy(md, s.extra(m))
	}
	md[DefaultKeyMetadata] = m.IdempotencyKey
	if at := m.StableEventTime(); !at.IsZero() {
		md[adapter.EventTimeHeader] = adapter.FormatEventTime(at)
	}
	maps.Copy(md, m.Trace)
	if m.OrderKey != "" {
		md[adapter.OrderKeyHeader] = m.OrderKey
		md[adapter.OrderSeqHeader] = adapter.FormatOrderSeq(m.OrderSeq)
	}
	if err := s.topic.Send(ctx, &pubsub.Message{Body: m.Payload, Metadata: md}); err != nil {
		return fmt.Errorf("cdkpubsub: publish outbox call %d (%s): %w", m.ID, m.Kind, err)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
