package watermill

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
)

// An EventTimeFunc returns a message's event time: when the producer says
// the message's event happened. Like the key, it must be the same on every
// delivery of the message — redelivered, published again, replayed from a
// poison topic — so it must come from the producer, never from the
// Pub/Sub or the consumer. An error, or the zero time, makes the message
// poison.
type EventTimeFunc func(msg *message.Message) (time.Time, error)

// TimeHeader returns an EventTimeFunc that reads the metadata field name,
// a producer's own, as adapter.FormatEventTime writes it (RFC 3339). A
// value that is not RFC 3339 fails with an error matching
// adapter.ErrBadEventTime; a missing or empty field is the zero time. Both
// are poison. (The default, adapter.EventTimeHeader, needs no
// TimeHeader: a message without it has no event time, which is poison only
// in partitioned mode.)
func TimeHeader(name string) EventTimeFunc {
	return func(msg *message.Message) (time.Time, error) {
		at, err := adapter.ParseEventTime(msg.Metadata.Get(name))
		if err != nil {
			return time.Time{}, fmt.Errorf("metadata %q: %w", name, err)
		}
		return at, nil
	}
}
