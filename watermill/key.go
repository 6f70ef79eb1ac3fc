package watermill

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
)

// KeyMetadata is the metadata field a [Sender] sets, besides the UUID, to
// the idempotency key of the outbox row it publishes: "idempotency_key".
// A consumer that keys by it reads it with Header(KeyMetadata).
const KeyMetadata = "idempotency_key"

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every copy of the message — redelivered, published again,
// replayed from a poison topic. An error (conventionally wrapping
// adapter.ErrNoKey) makes the message poison.
type KeyFunc = adapter.KeyFunc[*message.Message]

// UUID returns the KeyFunc that uses the message's UUID, the default: the
// id a Watermill producer gives each message, which every Pub/Sub carries
// on every redelivery. It is the message's identity only where the
// producer keeps it across every publish of the same message — a fixed
// UUID such as "order-completed:9912", or one stored with the message, as
// a [Sender] publishes each outbox row under its idempotency key.
// watermill.NewUUID() at each publish (a retry after a failed publish, a
// forwarder that mints new messages) gives the same effect a new key, and
// it is applied twice: key by a field of the producer's ([Header],
// [BodyField]) instead. An empty UUID fails with adapter.ErrNoKey.
func UUID() KeyFunc {
	return func(msg *message.Message) (string, error) {
		if msg.UUID == "" {
			return "", fmt.Errorf("%w: empty UUID", adapter.ErrNoKey)
		}
		return msg.UUID, nil
	}
}

// Header returns a KeyFunc that reads the metadata field name. A missing
// or empty field fails with adapter.ErrNoKey.
func Header(name string) KeyFunc {
	return adapter.HeaderKey(name, metadata)
}

// BodyField returns a KeyFunc that reads a field of the JSON object in the
// payload, following path through nested objects: BodyField("order", "id")
// reads {"order": {"id": …}} (see adapter.JSONField). A payload that is not
// a JSON object fails with adapter.ErrUndecodable, a missing or empty field
// with adapter.ErrNoKey: both poison. It panics if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("payload", func(msg *message.Message) []byte { return msg.Payload }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", Header("order_id")). Prefixes keep the
// keys of different message types apart when one consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc {
	return adapter.Prefixed(prefix, k)
}

// metadata returns the metadata field name of msg and whether it is set.
func metadata(msg *message.Message, name string) (string, bool) {
	v, ok := msg.Metadata[name]
	return v, ok
}
