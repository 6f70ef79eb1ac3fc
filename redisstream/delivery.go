package redisstream

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
)

// Field names the Consumer and the Sender use by default.
const (
	// DefaultKeyField is the entry field the default key function
	// (Field(DefaultKeyField)) reads and the Sender writes the outbox
	// row's idempotency key to.
	DefaultKeyField = "idempotency_key"
	// PayloadField is the entry field that holds the payload: what Decode
	// decodes, what BodyField reads a JSON field of, and where the Sender
	// writes an outbox call's payload.
	PayloadField = "payload"
)

// A Delivery is one delivery of a stream entry to the Consumer: the entry
// (its stream, id and fields) and how many times the consumer group has
// delivered it.
type Delivery struct {
	// Stream is the stream the entry was read from.
	Stream string
	// ID is the entry's id, "<milliseconds>-<sequence>", which Redis
	// assigned when it was added: a re-send (a second XADD) gets a new
	// one, so it identifies a delivery's entry, never the message.
	ID string
	// Values are the entry's fields. The producer's key (DefaultKeyField)
	// and event time (adapter.EventTimeHeader) are among them.
	Values map[string]string
	// Count is the consumer group's delivery count of the entry, from 1:
	// 1 for its first read, one more for each re-read after a requeue and
	// each re-claim from a consumer that died.
	Count int64
}

// Field returns the value of the entry's field name and whether it has one.
func (d *Delivery) Field(name string) (string, bool) {
	v, ok := d.Values[name]
	return v, ok
}

// Payload returns the entry's PayloadField, nil when it has none.
func (d *Delivery) Payload() []byte {
	v, ok := d.Values[PayloadField]
	if !ok {
		return nil
	}
	return []byte(v)
}

// Time returns the time in the entry's id: when Redis added the entry, to
// the millisecond, by its own clock. It is zero for an id it cannot parse.
func (d *Delivery) Time() time.Time {
	ms, _, ok := strings.Cut(d.ID, "-")
	if !ok {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// String returns "<stream>/<id>".
func (d *Delivery) String() string { return d.Stream + "/" + d.ID }

// ParkedDelivery rebuilds the Delivery of an entry that was parked
// because it arrived before its predecessor (idempotent.WithOrdering, see
// docs/ordering.md), for an idempotent.Ordering.Release that runs the
// Consumer's handler: its Values are every field the entry had (the
// payload in PayloadField). The delivery's Stream and ID are not kept
// (they are empty, and Time is zero: the parked message's EventTime is
// the event time it was read with), and its Count is 1.
func ParkedDelivery(p idempotent.ParkedMessage) *Delivery {
	vals := make(map[string]string, len(p.Headers)+1)
	maps.Copy(vals, p.Headers)
	if len(p.Payload) > 0 {
		vals[PayloadField] = string(p.Payload)
	}
	return &Delivery{Values: vals, Count: 1}
}

// newDelivery converts an entry read from stream, delivered count times.
func newDelivery(stream string, m redis.XMessage, count int64) *Delivery {
	vals := make(map[string]string, len(m.Values))
	for k, v := range m.Values {
		switch v := v.(type) {
		case string:
			vals[k] = v
		case []byte:
			vals[k] = string(v)
		default:
			vals[k] = fmt.Sprint(v)
		}
	}
	return &Delivery{Stream: stream, ID: m.ID, Values: vals, Count: count}
}
