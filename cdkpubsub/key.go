package cdkpubsub

import (
	"fmt"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/adapter"
)

// DefaultKeyMetadata is the metadata key the Consumer reads a message's key
// from unless WithKey says otherwise, and the one NewSender writes the
// outbox idempotency key to. gocloud.dev/pubsub has no producer-set message
// id common to its drivers — LoggableID is assigned by the service on most
// of them (a GCP message id, an SQS message id, mempubsub's counter), so a
// re-send would get a new one — hence a metadata key of the producer's.
const DefaultKeyMetadata = "idempotency-key"

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every delivery of the same message — redelivered after an
// ack deadline, published twice, or replayed from a dead-letter topic weeks
// later — so it must never use LoggableID or any other id the service
// assigns. An error (conventionally wrapping [adapter.ErrNoKey]) makes the
// message poison.
type KeyFunc = adapter.KeyFunc[*pubsub.Message]

// Metadata returns a KeyFunc that reads the metadata key name (exactly as
// written: metadata keys are case-sensitive). A missing or empty value
// fails with [adapter.ErrNoKey]. Metadata(DefaultKeyMetadata) is the
// default key.
func Metadata(name string) KeyFunc { return adapter.HeaderKey(name, metadata) }

// Header is Metadata, under the name every adapter of this module has.
func Header(name string) KeyFunc { return Metadata(name) }

// BodyField returns a KeyFunc that reads a field of a JSON object in the
// message's body, following path through nested objects:
// BodyField("order", "id") reads {"order": {"id": …}}. A string value is
// used as it is; a number as written in the body. A body that is not a
// JSON object fails with [adapter.ErrUndecodable]; a missing, null or empty
// field, or one of another type, with [adapter.ErrNoKey]. BodyField panics
// if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("body", func(m *pubsub.Message) []byte { return m.Body }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns.
// Prefixes keep the keys of different message types apart when one
// consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// An EventTimeFunc returns a message's event time, set once by the
// producer; see [WithEventTime].
type EventTimeFunc func(msg *pubsub.Message) (time.Time, error)

// TimeMetadata returns an EventTimeFunc that parses the metadata key name
// as [adapter.ParseEventTime] does (RFC 3339), for producers that set the
// event time under a key of their own rather than
// [adapter.EventTimeHeader], the default. A missing value fails with
// [adapter.ErrNoEventTime] and an unparsable one with
// [adapter.ErrBadEventTime]: either makes the message poison.
func TimeMetadata(name string) EventTimeFunc {
	return func(msg *pubsub.Message) (time.Time, error) {
		t, err := adapter.ParseEventTime(msg.Metadata[name])
		if err != nil {
			return time.Time{}, fmt.Errorf("metadata %q: %w", name, err)
		}
		if t.IsZero() {
			return time.Time{}, fmt.Errorf("%w: no %q metadata", adapter.ErrNoEventTime, name)
		}
		return t, nil
	}
}

// TimeHeader is TimeMetadata, under the name every adapter of this module
// has.
func TimeHeader(name string) EventTimeFunc { return TimeMetadata(name) }

// transport is what gocloud.dev/pubsub messages carry, for adapter.Config:
// metadata, and no transport time common to the drivers. It counts as
// ordered: some drivers hold back what follows a nacked message (Pub/Sub
// with ordering keys, an SQS FIFO message group, Kafka), and the adapter
// cannot tell which one it is given.
var transport = adapter.Transport[*pubsub.Message]{
	Name:       "cdkpubsub",
	DefaultKey: Metadata(DefaultKeyMetadata),
	Header:     metadata,
	Payload:    func(m *pubsub.Message) []byte { return m.Body },
	Ordered:    true,
	// The driver behind a topic is unknown to the adapter.
	System:    "gocloud.dev/pubsub",
	MessageID: func(m *pubsub.Message) string { return m.LoggableID },
}

// metadata returns msg's metadata value name.
func metadata(msg *pubsub.Message, name string) (string, bool) {
	v, ok := msg.Metadata[name]
	return v, ok
}
