package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
)

// A KeyFunc returns a delivery's message key: the stable identity the
// producer gave the message's effect, such as "order-completed:9912". It
// must return the same key for every delivery of the same message —
// redelivered, published twice, or replayed from a dead-letter queue weeks
// later — so it must never use the delivery tag, the redelivered flag, or
// an id that a broker or relay reassigns on republish. An error
// (conventionally wrapping adapter.ErrNoKey) makes the delivery poison.
// Give one to a Consumer with [WithKey]; the default is [MessageID].
type KeyFunc = adapter.KeyFunc[*amqp.Delivery]

// MessageID returns a KeyFunc that reads the AMQP message_id property, set
// by the producer in amqp091.Publishing.MessageId: the default key. A
// delivery without one fails with adapter.ErrNoKey.
func MessageID() KeyFunc {
	return func(d *amqp.Delivery) (string, error) {
		if d.MessageId == "" {
			return "", fmt.Errorf("%w: the message_id property is empty", adapter.ErrNoKey)
		}
		return d.MessageId, nil
	}
}

// Header returns a KeyFunc that reads the application header name. A
// string or byte-slice value is used as it is, an integer in decimal. A
// missing or empty header fails with adapter.ErrNoKey, and a value of
// another type (a float, a table, …) with an error that also matches
// adapter.ErrNoKey.
func Header(name string) KeyFunc {
	k := adapter.HeaderKey(name, headerValue)
	return func(d *amqp.Delivery) (string, error) {
		if v, ok := d.Headers[name]; ok && v != nil && !textual(v) {
			return "", fmt.Errorf("%w: header %q is a %T, want a string or an integer", adapter.ErrNoKey, name, v)
		}
		return k(d)
	}
}

// BodyField returns a KeyFunc that reads a field of a JSON object body,
// following path through nested objects: BodyField("order", "id") reads
// {"order": {"id": …}}. A string value is used as it is; a number as
// written in the body, so producers should write ids as integers. A body
// that is not a JSON object fails with adapter.ErrUndecodable; a missing,
// null or empty field, or one of another type, with adapter.ErrNoKey.
// BodyField panics if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("body", func(d *amqp.Delivery) []byte { return d.Body }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", BodyField("order_id")) for the key
// "order-completed:9912". Prefixes keep the keys of different message
// types apart when one consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// textual reports whether an AMQP header value reads as text: a string, a
// byte slice or an integer.
func textual(v any) bool {
	switch v.(type) {
	case string, []byte, int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return true
	}
	return false
}

// headerValue returns d's header name as text, and whether d has it: a
// string or byte slice as it is, any other value as fmt prints it (an
// integer in decimal).
func headerValue(d *amqp.Delivery, name string) (string, bool) {
	v, ok := d.Headers[name]
	if !ok || v == nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return fmt.Sprint(v), true
}
