package watermill

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// KeyMetadata is the metadata field the middleware reads the message key
// from by default, and the field a [Sender] sets on the messages it
// publishes: "idempotency_key".
const KeyMetadata = "idempotency_key"

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every delivery of the same message. An error (conventionally
// wrapping [ErrNoKey]) makes the message poison.
type KeyFunc func(msg *message.Message) (string, error)

// Metadata returns a KeyFunc that reads the metadata field name. A missing
// or empty field fails with ErrNoKey.
func Metadata(name string) KeyFunc {
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: no %q metadata", ErrNoKey, name)
		}
		return v, nil
	}
}

// UUID returns a KeyFunc that uses the message's UUID. Use it only where the
// producer keeps the UUID stable across every publish of the same message:
// watermill.NewUUID() at each publish — including a retry after a failed
// publish, or a forwarder or poison-queue republish that mints a new message
// — gives the same effect a new key, and it is applied twice. The UUID of a
// redelivery (the broker sending the same message again) is stable on every
// Watermill Pub/Sub that carries it, which is all this guards against. An
// empty UUID fails with ErrNoKey.
func UUID() KeyFunc {
	return func(msg *message.Message) (string, error) {
		if msg.UUID == "" {
			return "", fmt.Errorf("%w: empty UUID", ErrNoKey)
		}
		return msg.UUID, nil
	}
}
