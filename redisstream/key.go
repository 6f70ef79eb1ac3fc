package redisstream

import (
	"fmt"
	"time"

	"github.com/txclaim/idempotent/adapter"
)

// A KeyFunc returns an entry's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return
// the same key for every delivery of the same message — re-read after a
// requeue, re-claimed from a dead consumer, added again by a producer
// retry, or replayed from a dead-letter stream — so it must never use the
// entry id, the delivery count or anything Redis assigns. An error
// (conventionally wrapping [adapter.ErrNoKey]) makes the delivery poison.
type KeyFunc = adapter.KeyFunc[*Delivery]

// Field returns a KeyFunc that reads the entry's field name. A missing or
// empty field fails with [adapter.ErrNoKey]. Field(DefaultKeyField) is
// the default key, the field the Sender writes.
func Field(name string) KeyFunc { return adapter.HeaderKey(name, field) }

// BodyField returns a KeyFunc that reads a field of the JSON object in the
// entry's PayloadField, following path through nested objects:
// BodyField("order", "id") reads {"order": {"id": …}}. A string value is
// used as it is; a number as written in the payload. A payload that is not
// a JSON object fails with [adapter.ErrUndecodable]; a missing, null or
// empty field, or one of another type, with [adapter.ErrNoKey]. BodyField
// panics if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("payload", (*Delivery).Payload, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns.
// Prefixes keep the keys of different message types apart when one
// consumer group reads several kinds of entry.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// An EventTimeFunc returns an entry's event time, set once by the
// producer; see [WithEventTime].
type EventTimeFunc func(d *Delivery) (time.Time, error)

// TimeField returns an EventTimeFunc that parses the entry's field name as
// [adapter.ParseEventTime] does (RFC 3339), for producers that write the
// event time to a field of their own rather than [adapter.EventTimeHeader],
// the default. A missing field fails with [adapter.ErrNoEventTime] and an
// unparsable one with [adapter.ErrBadEventTime]: either makes the delivery
// poison.
func TimeField(name string) EventTimeFunc {
	return func(d *Delivery) (time.Time, error) {
		t, err := adapter.ParseEventTime(d.Values[name])
		if err != nil {
			return time.Time{}, fmt.Errorf("field %q: %w", name, err)
		}
		if t.IsZero() {
			return time.Time{}, fmt.Errorf("%w: no %q field", adapter.ErrNoEventTime, name)
		}
		return t, nil
	}
}

// transport is what stream entries carry, for adapter.Config.
var transport = adapter.Transport[*Delivery]{
	Name:        "redisstream",
	DefaultKey:  Field(DefaultKeyField),
	Header:      field,
	Time:        (*Delivery).Time,
	TimeName:    "the time in the entry id",
	System:      "redis",
	Destination: func(d *Delivery) string { return d.Stream },
	MessageID:   func(d *Delivery) string { return d.ID },
	// An ordered entry that has to wait for its predecessor is parked
	// with every field: its PayloadField as the payload, the others as
	// headers (ParkedDelivery rebuilds it).
	Payload: (*Delivery).Payload,
	Headers: func(d *Delivery) map[string]string {
		h := make(map[string]string, len(d.Values))
		for k, v := range d.Values {
			if k != PayloadField {
				h[k] = v
			}
		}
		return h
	},
}

func field(d *Delivery, name string) (string, bool) { return d.Field(name) }
