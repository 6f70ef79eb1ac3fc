package kafka

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/internal/jsonkey"
)

// DefaultKeyHeader is the record header a Consumer reads the message key
// from when it is given no KeyFunc: the producer sets it to the message's
// stable identity, such as "order-completed:9912".
const DefaultKeyHeader = "idempotency-key"

// CloudEventsIDHeader is the header that carries a CloudEvent's id in the
// Kafka protocol binding's binary mode; see CloudEventsID.
const CloudEventsIDHeader = "ce_id"

// A KeyFunc returns a record's message key: the stable identity the producer
// gave the message's effect. It must return the same key for every copy of
// the message — re-sent by a producer retry, produced twice, or replayed to
// another topic weeks later — so it must never be built from the topic, the
// partition or the offset alone: those are assigned by the broker, and a
// re-sent or replayed copy gets new ones. An error (conventionally wrapping
// [ErrNoKey]) makes the record poison.
type KeyFunc func(r *kgo.Record) (string, error)

// Header returns a KeyFunc that reads the record header name (the first, if
// the record has several). A missing or empty header fails with ErrNoKey.
func Header(name string) KeyFunc {
	return func(r *kgo.Record) (string, error) {
		for _, h := range r.Headers {
			if h.Key == name {
				if len(h.Value) == 0 {
					return "", fmt.Errorf("%w: header %q is empty", ErrNoKey, name)
				}
				return string(h.Value), nil
			}
		}
		return "", fmt.Errorf("%w: no %q header", ErrNoKey, name)
	}
}

// CloudEventsID returns a KeyFunc that reads a CloudEvent's id from the
// ce_id header (binary content mode). CloudEvents ids are unique per
// source, so combine it with Prefixed when one consumer reads events of
// several sources.
func CloudEventsID() KeyFunc { return Header(CloudEventsIDHeader) }

// BodyField returns a KeyFunc that reads a field of a JSON object value,
// following path through nested objects: BodyField("order", "id") reads
// {"order": {"id": …}}. A string value is used as it is; a number is used as
// written. A value that is not a JSON object fails with ErrUndecodable; a
// missing, null or empty field, or one of another type, fails with ErrNoKey.
// BodyField panics if path is empty.
func BodyField(path ...string) KeyFunc {
	if len(path) == 0 {
		panic("kafka: BodyField: empty path")
	}
	return func(r *kgo.Record) (string, error) {
		return jsonkey.Field(r.Value, path, "value", ErrUndecodable, ErrNoKey)
	}
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", Header("order-id")). Prefixes keep the
// keys of different message types apart when one consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc {
	return func(r *kgo.Record) (string, error) {
		key, err := k(r)
		if err != nil {
			return "", err
		}
		return prefix + key, nil
	}
}
