package rabbitmq

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
)

// An EventTimeFunc returns a delivery's event time: when the producer says
// the message's event happened. Like the key, it must be the same for
// every delivery of the message — redelivered, published twice, or
// replayed from a dead-letter queue — so it must be set by the producer,
// never by the broker or the consumer. An error, or the zero time, makes
// the delivery poison: an error is wrapped with
// idempotent.ErrInvalidEventTime unless it already matches it or
// adapter.ErrPoison. Give one to a Consumer with [WithEventTime].
type EventTimeFunc func(d *amqp.Delivery) (time.Time, error)

// TimeHeader returns an EventTimeFunc that reads the producer's header
// name, an RFC 3339 time (as adapter.FormatEventTime writes it): for a
// producer that sets its event time in a header of its own rather than
// adapter.EventTimeHeader, the default. A delivery without the header
// fails with adapter.ErrNoEventTime, one whose header is not an RFC 3339
// string with adapter.ErrBadEventTime; both are poison.
func TimeHeader(name string) EventTimeFunc {
	return func(d *amqp.Delivery) (time.Time, error) {
		v, ok := headerValue(d, name)
		if !ok {
			return time.Time{}, fmt.Errorf("%w: no %q header", adapter.ErrNoEventTime, name)
		}
		at, err := adapter.ParseEventTime(v)
		if err != nil {
			return time.Time{}, fmt.Errorf("header %q: %w", name, err)
		}
		if at.IsZero() {
			return time.Time{}, fmt.Errorf("%w: header %q is empty", adapter.ErrNoEventTime, name)
		}
		return at, nil
	}
}

// transport is what the shared configuration knows of AMQP deliveries:
// the message_id property is the default key, the event time header is an
// application header, and the timestamp property is the transport's time.
var transport = adapter.Transport[*amqp.Delivery]{
	Name:       "rabbitmq",
	DefaultKey: MessageID(),
	Header:     headerValue,
	Time:       func(d *amqp.Delivery) time.Time { return d.Timestamp },
	TimeName:   "the AMQP timestamp property",
	System:     "rabbitmq",
	Destination: func(d *amqp.Delivery) string {
		if d.Exchange == "" {
			return d.RoutingKey // the default exchange's routing key is the queue
		}
		return d.Exchange
	},
	MessageID: func(d *amqp.Delivery) string { return d.MessageId },
	Payload:   func(d *amqp.Delivery) []byte { return d.Body },
}
