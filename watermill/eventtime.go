package watermill

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// An EventTimeFunc returns a message's event time: when the producer says
// the message's event happened. Like the key, it must be the same on every
// delivery of the message — redelivered, published again, replayed from a
// poison topic — so it must come from the producer, never from the broker
// or the consumer. The zero time means the message has none. An error makes
// the message poison.
type EventTimeFunc func(msg *message.Message) (time.Time, error)

// EventTimeMetadata returns an EventTimeFunc that reads the metadata field
// name, as adapter.FormatEventTime writes it (RFC 3339). A missing or empty
// field is the zero time: the message has no event time. Any other value
// that is not RFC 3339 fails with an error matching adapter.ErrBadEventTime
// (and idempotent.ErrInvalidEventTime): the message is poison.
func EventTimeMetadata(name string) EventTimeFunc {
	return func(msg *message.Message) (time.Time, error) {
		at, err := adapter.ParseEventTime(msg.Metadata.Get(name))
		if err != nil {
			return time.Time{}, fmt.Errorf("metadata %q: %w", name, err)
		}
		return at, nil
	}
}

// WithEventTime sets where each message's event time comes from: a
// metadata field of the producer's (EventTimeMetadata) or a function over
// the payload. The middleware passes it to the Middleware
// (idempotent.Message.EventTime), so a message older than the retention
// window is refused (idempotent.ErrBeyondRetention) and poison instead of
// being applied a second time after its claim was cleaned up, and in
// partitioned mode the claim goes to the event day's partition. f must read
// a time the producer set: a time a Pub/Sub stamps on each publish (a
// broker's arrival time, a Kafka record timestamp Watermill copies into the
// metadata) is new on every re-send, so a re-send after UTC midnight lands
// in another day's partition and is applied again. Default is
// EventTimeMetadata(adapter.EventTimeHeader): the producer sets
// msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(t)).
func WithEventTime(f EventTimeFunc) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("watermill: WithEventTime: nil function")
		}
		c.eventTime = f
		return nil
	})
}

// WithoutEventTime makes the middleware read no event time: every message
// is claimed by its key alone, the retention fence cannot apply, and New
// refuses it for a Middleware in partitioned mode
// (idempotent.WithDailyPartitions), whose claims need their event day:
// the error matches adapter.ErrNoProducerEventTime. Default is the
// adapter.EventTimeHeader metadata field (see WithEventTime).
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error {
		c.eventTime = nil
		return nil
	})
}

// message returns msg as the Middleware sees it: key and event time. An
// event-time function's error is wrapped with
// idempotent.ErrInvalidEventTime unless it matches it already.
func (c *config) message(msg *message.Message) (idempotent.Message, error) {
	key, err := c.key(msg)
	if err != nil {
		if !errors.Is(err, idempotent.ErrInvalidKey) && !errors.Is(err, ErrPoison) {
			err = fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
		}
		return idempotent.Message{}, fmt.Errorf("watermill: message %s: %w", msg.UUID, err)
	}
	m := idempotent.Message{Key: key}
	if c.eventTime == nil {
		return m, nil
	}
	at, err := c.eventTime(msg)
	if err != nil {
		if !errors.Is(err, idempotent.ErrInvalidEventTime) && !errors.Is(err, ErrPoison) {
			err = fmt.Errorf("%w: event time function: %w", idempotent.ErrInvalidEventTime, err)
		}
		return m, fmt.Errorf("watermill: message %q: %w", key, err)
	}
	m.EventTime = at
	return m, nil
}
