package mqtt

import (
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
)

// DefaultKeyProperty is the MQTT 5 user property the Consumer reads a
// message's key from unless WithKey says otherwise, and the one the Sender
// writes the outbox idempotency key to. MQTT has no message id of the
// producer's (a packet identifier is the connection's, reused and
// renumbered on every hop), hence a user property.
const DefaultKeyProperty = "idempotency-key"

// A KeyFunc returns a message's key: the stable identity the producer gave
// the message's effect, such as "order-completed:9912". It must return the
// same key for every delivery of the same message — redelivered after a
// reconnect, published twice, or replayed later — so it must never use the
// packet identifier. An error (conventionally wrapping [adapter.ErrNoKey])
// makes the message poison.
type KeyFunc = adapter.KeyFunc[*paho.Publish]

// Property returns a KeyFunc that reads the user property name (exactly as
// written: user property names are case-sensitive; the first of several).
// A missing or empty value fails with [adapter.ErrNoKey].
// Property(DefaultKeyProperty) is the default key.
func Property(name string) KeyFunc { return adapter.HeaderKey(name, property) }

// Header is Property, under the name every adapter of this module has.
func Header(name string) KeyFunc { return Property(name) }

// BodyField returns a KeyFunc that reads a field of a JSON object in the
// message's payload, following path through nested objects:
// BodyField("order", "id") reads {"order": {"id": …}}. A string value is
// used as it is; a number as written in the payload. A payload that is not
// a JSON object fails with [adapter.ErrUndecodable]; a missing, null or
// empty field, or one of another type, with [adapter.ErrNoKey]. BodyField
// panics if path is empty.
func BodyField(path ...string) KeyFunc {
	return adapter.BodyFieldKey("payload", func(m *paho.Publish) []byte { return m.Payload }, path...)
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns.
// Prefixes keep the keys of different message types apart when one
// consumer reads several.
func Prefixed(prefix string, k KeyFunc) KeyFunc { return adapter.Prefixed(prefix, k) }

// An EventTimeFunc returns a message's event time, set once by the
// producer; see [WithEventTime].
type EventTimeFunc func(msg *paho.Publish) (time.Time, error)

// TimeProperty returns an EventTimeFunc that parses the user property name
// as [adapter.ParseEventTime] does (RFC 3339), for producers that set the
// event time under a name of their own rather than
// [adapter.EventTimeHeader], the default. A missing value fails with
// [adapter.ErrNoEventTime] and an unparsable one with
// [adapter.ErrBadEventTime]: either makes the message poison.
func TimeProperty(name string) EventTimeFunc {
	return func(msg *paho.Publish) (time.Time, error) {
		v, _ := property(msg, name)
		t, err := adapter.ParseEventTime(v)
		if err != nil {
			return time.Time{}, fmt.Errorf("user property %q: %w", name, err)
		}
		if t.IsZero() {
			return time.Time{}, fmt.Errorf("%w: no %q user property", adapter.ErrNoEventTime, name)
		}
		return t, nil
	}
}

// TimeHeader is TimeProperty, under the name every adapter of this module
// has.
func TimeHeader(name string) EventTimeFunc { return TimeProperty(name) }

// transport is what MQTT 5 messages carry, for adapter.Config: user
// properties, and no time at all (MQTT stamps none). It counts as ordered:
// acknowledgements go back in the order the messages came (MQTT 5, 4.6),
// so a message waiting for its retry holds back the acknowledgements of
// those behind it, and, once the broker's in-flight window is full, their
// delivery.
var transport = adapter.Transport[*paho.Publish]{
	Name:       "mqtt",
	DefaultKey: Property(DefaultKeyProperty),
	Header:     property,
	Payload:    func(m *paho.Publish) []byte { return m.Payload },
	Ordered:    true,
	System:     "mqtt",
	// The topic the message was published to (a shared subscription's
	// $share/group/ prefix is the subscriber's, not the message's).
	Destination: func(m *paho.Publish) string { return m.Topic },
}

// property returns the first value of msg's user property name.
func property(msg *paho.Publish, name string) (string, bool) {
	if msg.Properties == nil {
		return "", false
	}
	for _, p := range msg.Properties.User {
		if p.Key == name {
			return p.Value, true
		}
	}
	return "", false
}
