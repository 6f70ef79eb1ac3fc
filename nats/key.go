package nats

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
)

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every delivery of the same message — redelivered after a
// lost ack, published twice, or republished from another stream weeks
// later — so it must never use the stream or consumer sequence, the
// delivery count, or any id the server assigns. An error (conventionally
// wrapping [adapter.ErrNoKey]) makes the message poison.
type KeyFunc = adapter.KeyFunc[jetstream.Msg]

// MsgID returns a KeyFunc that reads the Nats-Msg-Id header
// (jetstream.MsgIDHeader), the id a producer sets with jetstream.WithMsgID
// and the stream uses to drop repeated publishes within its duplicate
// window. It is the default key. A message without one fails with
// [adapter.ErrNoKey].
func MsgID() KeyFunc { return Header(jetstream.MsgIDHeader) }

// Header returns a KeyFunc that reads the first value of the header name
// (header names are case-sensitive in NATS). A missing or empty header
// fails with [adapter.ErrNoKey].
func Header(name string) KeyFunc { return adapter.HeaderKey(name, header) }

// BodyField returns a KeyFunc that reads a field of a JSON object in the
// message's data, following path through nested objects:
// BodyField("order", "id") reads {"order": {"id": …}}. A string value is
// used as it is; a number as written in the data. Data that is not a JSON
// object fails with [adapter.ErrUndecodable]; a missing, null or empty
// field, or one of another type, with [adapter.ErrNoKey]. BodyField panics
// if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("data", func(m jetstream.Msg) []byte { return m.Data() }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns.
// Prefixes keep the keys of different message types apart when one
// consumer reads several subjects.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// An EventTimeFunc returns a message's event time, set once by the
// producer; see [WithEventTime].
type EventTimeFunc func(msg jetstream.Msg) (time.Time, error)

// TimeHeader returns an EventTimeFunc that parses the header name as
// [adapter.ParseEventTime] does (RFC 3339), for producers that set the
// event time in a header of their own rather than
// [adapter.EventTimeHeader], the default. A missing header fails with
// [adapter.ErrNoEventTime] and an unparsable one with
// [adapter.ErrBadEventTime]: either makes the message poison.
func TimeHeader(name string) EventTimeFunc {
	return func(msg jetstream.Msg) (time.Time, error) {
		t, err := adapter.ParseEventTime(msg.Headers().Get(name))
		if err != nil {
			return time.Time{}, fmt.Errorf("header %q: %w", name, err)
		}
		if t.IsZero() {
			return time.Time{}, fmt.Errorf("%w: no %q header", adapter.ErrNoEventTime, name)
		}
		return t, nil
	}
}

// transport is what JetStream messages carry, for adapter.Config.
var transport = adapter.Transport[jetstream.Msg]{
	Name:        "nats",
	DefaultKey:  MsgID(),
	Header:      header,
	Time:        streamTime,
	TimeName:    "the stream's timestamp",
	System:      "nats",
	Destination: func(m jetstream.Msg) string { return m.Subject() },
	MessageID: func(m jetstream.Msg) string {
		v, _ := header(m, jetstream.MsgIDHeader)
		return v
	},
	Payload: func(m jetstream.Msg) []byte { return m.Data() },
}

// header returns the first value of msg's header name.
func header(msg jetstream.Msg, name string) (string, bool) {
	v := msg.Headers().Values(name)
	if len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// streamTime is the time the stream stored msg, zero when its metadata
// cannot be read.
func streamTime(msg jetstream.Msg) time.Time {
	md, err := msg.Metadata()
	if err != nil {
		return time.Time{}
	}
	return md.Timestamp
}
