package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/internal/jsonkey"
)

// A KeyFunc returns a delivery's message key: the stable identity the
// producer gave the message's effect, such as "order-completed:9912". It must
// return the same key for every delivery of the same message — redelivered,
// published twice, or replayed from a dead-letter queue weeks later — so it
// must never use the delivery tag, the redelivered flag, or an id that a
// broker or relay reassigns on republish. An error (conventionally wrapping
// [ErrNoKey]) makes the delivery poison.
type KeyFunc func(d *amqp.Delivery) (string, error)

// MessageID returns a KeyFunc that reads the AMQP message_id property, set
// by the producer in amqp091.Publishing.MessageId. A delivery without one
// fails with ErrNoKey.
func MessageID() KeyFunc {
	return func(d *amqp.Delivery) (string, error) {
		if d.MessageId == "" {
			return "", fmt.Errorf("%w: the message_id property is empty", ErrNoKey)
		}
		return d.MessageId, nil
	}
}

// Header returns a KeyFunc that reads the application header name. A string
// or byte-slice value is used as it is, an integer in decimal. A missing or
// empty header fails with ErrNoKey, and a value of another type (a float, a
// table, …) with an error that also matches ErrNoKey.
func Header(name string) KeyFunc {
	return func(d *amqp.Delivery) (string, error) {
		v, ok := d.Headers[name]
		if !ok || v == nil {
			return "", fmt.Errorf("%w: no %q header", ErrNoKey, name)
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
			s = fmt.Sprint(v)
		default:
			return "", fmt.Errorf("%w: header %q is a %T, want a string or an integer", ErrNoKey, name, v)
		}
		if s == "" {
			return "", fmt.Errorf("%w: header %q is empty", ErrNoKey, name)
		}
		return s, nil
	}
}

// BodyField returns a KeyFunc that reads a field of a JSON object body,
// following path through nested objects: BodyField("order", "id") reads
// {"order": {"id": …}}. A string value is used as it is; a number is used as
// written in the body, so producers should write ids as integers. A body
// that is not a JSON object fails with ErrUndecodable; a missing, null or
// empty field, or one of another type, fails with ErrNoKey. BodyField panics
// if path is empty.
func BodyField(path ...string) KeyFunc {
	if len(path) == 0 {
		panic("rabbitmq: BodyField: empty path")
	}
	return func(d *amqp.Delivery) (string, error) {
		return jsonkey.Field(d.Body, path, "body", ErrUndecodable, ErrNoKey)
	}
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", BodyField("order_id")) for the key
// "order-completed:9912". Prefixes keep the keys of different message types
// apart when one consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc {
	return func(d *amqp.Delivery) (string, error) {
		key, err := k(d)
		if err != nil {
			return "", err
		}
		return prefix + key, nil
	}
}
