package mqtt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// A Publisher publishes one MQTT 5 message and returns once the broker has
// it (PUBACK at QoS 1, PUBCOMP at QoS 2): a connected *paho.Client, or an
// autopaho *ConnectionManager.
type Publisher interface {
	Publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error)
}

// A Sender publishes outbox calls to an MQTT topic, for an outbox.Relay
// (register it with outbox.WithSender). Each call is published with its
// payload and two user properties: DefaultKeyProperty, the row's
// idempotency key — the key a Consumer downstream reads by default, so a
// call the relay publishes twice (its Send failed after the broker had the
// message, its lease expired mid-call) is applied once — and
// adapter.EventTimeHeader, the event time of the message whose handler
// enqueued the call (outbox.WithEventTime, Message.EventTime), else the
// row's CreatedAt: the same on every publish of the row. QoS 2 keeps the
// broker from storing a retried PUBLISH twice only within one session; the
// consumer's claim is what drops the repeats.
//
// A call enqueued with outbox.WithOrder also carries its ordering key and
// sequence in adapter.OrderKeyHeader and adapter.OrderSeqHeader, read by a
// consumer created idempotent.WithOrdering (docs/ordering.md).
type Sender struct {
	pub   Publisher
	topic func(m outbox.Message) string
	qos   byte
}

// A SenderOption configures a Sender.
type SenderOption func(*Sender) error

// WithQoS sets the QoS the Sender publishes at, 1 or 2. Default is 1.
func WithQoS(qos byte) SenderOption {
	return func(s *Sender) error {
		if qos < 1 || qos > 2 {
			return fmt.Errorf("mqtt: WithQoS: %d, want 1 or 2", qos)
		}
		s.qos = qos
		return nil
	}
}

// WithTopicFunc makes the Sender publish each call to the topic f returns
// for it (such as "orders/" + a customer id from m.Kind or m.Payload)
// instead of the topic given to NewSender. Default is NewSender's topic.
func WithTopicFunc(f func(m outbox.Message) string) SenderOption {
	return func(s *Sender) error {
		if f == nil {
			return errors.New("mqtt: WithTopicFunc: nil function")
		}
		s.topic = f
		return nil
	}
}

// NewSender returns a Sender that publishes each call's payload to topic
// through pub, at QoS 1 unless WithQoS says otherwise. The caller keeps pub
// connected (an autopaho ConnectionManager reconnects by itself).
func NewSender(pub Publisher, topic string, opts ...SenderOption) (*Sender, error) {
	if pub == nil {
		return nil, errors.New("mqtt: NewSender: nil publisher")
	}
	s := &Sender{pub: pub, qos: 1}
	if topic != "" {
		s.topic = func(outbox.Message) string { return topic }
	}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("mqtt: NewSender: nil option")
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if s.topic == nil {
		return nil, errors.New("mqtt: NewSender: empty topic and no WithTopicFunc")
	}
	return s, nil
}

// Send publishes m and waits until the broker has it. Any error is retried
// by the relay, which marks the row dead after its maximum number of
// attempts.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	props := paho.UserProperties{{Key: DefaultKeyProperty, Value: m.IdempotencyKey}}
	if at := m.StableEventTime(); !at.IsZero() {
		props = append(props, paho.UserProperty{Key: adapter.EventTimeHeader, Value: adapter.FormatEventTime(at)})
	}
	if m.OrderKey != "" {
		props = append(props, paho.UserProperty{Key: adapter.OrderKeyHeader, Value: m.OrderKey},
			paho.UserProperty{Key: adapter.OrderSeqHeader, Value: adapter.FormatOrderSeq(m.OrderSeq)})
	}
	for _, k := range slices.Sorted(maps.Keys(m.Trace)) { // the enqueuer's trace context (outbox.WithTracer)
		props = append(props, paho.UserProperty{Key: k, Value: m.Trace[k]})
	}
	topic := s.topic(m)
	resp, err := s.pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: s.qos, Payload: m.Payload,
		Properties: &paho.PublishProperties{User: props}})
	if err == nil && resp != nil && resp.ReasonCode >= 0x80 {
		err = fmt.Errorf("reason code 0x%02X", resp.ReasonCode)
	}
	if err != nil {
		return fmt.Errorf("mqtt: publish outbox call %d (%s) to %q: %w", m.ID, m.Kind, topic, err)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
