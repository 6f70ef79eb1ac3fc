package kafka

import (
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
)

// DefaultKeyHeader is the record header a Consumer reads the message key
// from when it is given no WithKey: the producer sets it to the message's
// stable identity, such as "order-completed:9912". Kafka records carry no
// producer-set message id of their own (the record key is a partitioning
// key, often shared by many messages), so the key is a header.
const DefaultKeyHeader = "idempotency-key"

// CloudEventsIDHeader is the header that carries a CloudEvent's id in the
// Kafka protocol binding's binary mode; see CloudEventsID.
const CloudEventsIDHeader = "ce_id"

// A KeyFunc returns a record's message key: the stable identity the
// producer gave the message's effect. It must return the same key for
// every copy of the message — re-sent by a producer retry, produced twice,
// or replayed to another topic weeks later — so it must never be built from
// the topic, the partition or the offset alone: those are assigned by the
// broker, and a re-sent or replayed copy gets new ones. An error
// (conventionally wrapping adapter.ErrNoKey) makes the record poison.
type KeyFunc = adapter.KeyFunc[*kgo.Record]

// EventTimeFunc returns the event time of a record: the time its producer
// gave the event, the same on every re-send (see WithEventTime). An error,
// or the zero time, makes the record poison.
type EventTimeFunc func(r *kgo.Record) (time.Time, error)

// header returns the value of r's first header name, and whether r has
// one.
func header(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// Header returns a KeyFunc that reads the record header name (the first, if
// the record has several). A missing or empty header fails with
// adapter.ErrNoKey.
func Header(name string) KeyFunc { return adapter.HeaderKey(name, header) }

// CloudEventsID returns a KeyFunc that reads a CloudEvent's id from the
// ce_id header (binary content mode). CloudEvents ids are unique per
// source, so combine it with Prefixed when one consumer reads events of
// several sources.
func CloudEventsID() KeyFunc { return Header(CloudEventsIDHeader) }

// BodyField returns a KeyFunc that reads a field of a JSON object value,
// following path through nested objects: BodyField("order", "id") reads
// {"order": {"id": …}}. A string value is used as it is; a number is used
// as written. A value that is not a JSON object fails with
// adapter.ErrUndecodable; a missing, null or empty field, or one of another
// type, fails with adapter.ErrNoKey. BodyField panics if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("value", func(r *kgo.Record) []byte { return r.Value }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", Header("order-id")). Prefixes keep the
// keys of different message types apart when one consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// TimeHeader returns an EventTimeFunc, for WithEventTime, that reads the
// event time from the record header name (the first, if the record has
// several), an RFC 3339 time set by the producer: for producers that carry
// the event time in a header of their own rather than
// adapter.EventTimeHeader. A missing or empty header fails with
// adapter.ErrNoEventTime, a value that is not an RFC 3339 time with
// adapter.ErrBadEventTime: either makes the record poison.
func TimeHeader(name string) EventTimeFunc {
	return func(r *kgo.Record) (time.Time, error) {
		v, ok := header(r, name)
		if !ok || strings.TrimSpace(v) == "" {
			return time.Time{}, fmt.Errorf("%w: no %q header", adapter.ErrNoEventTime, name)
		}
		at, err := adapter.ParseEventTime(v)
		if err != nil {
			return time.Time{}, fmt.Errorf("header %q: %w", name, err)
		}
		return at, nil
	}
}
