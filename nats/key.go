package nats

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"

	"github.com/txclaim/idempotent/internal/jsonkey"
)

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every delivery of the same message — redelivered after a lost
// ack, published twice, or republished from another stream weeks later — so
// it must never use the stream or consumer sequence, the delivery count, or
// any id the server assigns. An error (conventionally wrapping [ErrNoKey])
// makes the message poison.
type KeyFunc func(msg jetstream.Msg) (string, error)

// MsgID returns a KeyFunc that reads the Nats-Msg-Id header
// (jetstream.MsgIDHeader), the id a producer sets with jetstream.WithMsgID
// and the stream uses to drop repeated publishes within its duplicate window.
// It is the default key. A message without one fails with ErrNoKey.
func MsgID() KeyFunc { return Header(jetstream.MsgIDHeader) }

// Header returns a KeyFunc that reads the first value of the header name. A
// missing or empty header fails with ErrNoKey.
func Header(name string) KeyFunc {
	return func(msg jetstream.Msg) (string, error) {
		v := msg.Headers().Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: no %q header", ErrNoKey, name)
		}
		return v, nil
	}
}

// BodyField returns a KeyFunc that reads a field of a JSON object body,
// following path through nested objects: BodyField("order", "id") reads
// {"order": {"id": …}}. A string value is used as it is; a number as written
// in the body. Data that is not a JSON object fails with ErrUndecodable; a
// missing, null or empty field, or one of another type, fails with ErrNoKey.
// BodyField panics if path is empty.
func BodyField(path ...string) KeyFunc {
	if len(path) == 0 {
		panic("nats: BodyField: empty path")
	}
	return func(msg jetstream.Msg) (string, error) {
		return jsonkey.Field(msg.Data(), path, "data", ErrUndecodable, ErrNoKey)
	}
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns.
// Prefixes keep the keys of different message types apart when one consumer
// reads several subjects.
func Prefixed(prefix string, k KeyFunc) KeyFunc {
	return func(msg jetstream.Msg) (string, error) {
		key, err := k(msg)
		if err != nil {
			return "", err
		}
		return prefix + key, nil
	}
}

// A TimeFunc returns a message's event time, set once by the producer; see
// WithEventTime.
type TimeFunc func(msg jetstream.Msg) (time.Time, error)

// TimeHeader returns a TimeFunc that parses the header name as
// adapter.ParseEventTime does (RFC 3339), for producers that set the event
// time in a header other than adapter.EventTimeHeader, the default. A
// missing header fails with an error matching idempotent.ErrInvalidEventTime
// and an unparsable one with adapter.ErrBadEventTime: either makes the
// message poison.
func TimeHeader(name string) TimeFunc {
	return func(msg jetstream.Msg) (time.Time, error) {
		t, err := adapter.ParseEventTime(msg.Headers().Get(name))
		if err != nil {
			return time.Time{}, fmt.Errorf("header %q: %w", name, err)
		}
		if t.IsZero() {
			return time.Time{}, fmt.Errorf("%w: no %q header", idempotent.ErrInvalidEventTime, name)
		}
		return t, nil
	}
}
