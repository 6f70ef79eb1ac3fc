package rabbitmq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// ErrNoEventTime reports a delivery that carries no event time where the
// Handler must find one: in partitioned mode, no adapter.EventTimeHeader
// header; with WithTransportEventTime, no timestamp property; with
// WithEventTime, a function that returned the zero time. It matches
// idempotent.ErrInvalidEventTime, so the delivery is poison.
var ErrNoEventTime = fmt.Errorf("%w: delivery carries no event time", idempotent.ErrInvalidEventTime)

// An EventTimeFunc returns a delivery's event time: when the producer says
// the message's event happened. Like the key, it must be the same for every
// delivery of the message — redelivered, published twice, or replayed from
// a dead-letter queue — so it must be set by the producer, never by the
// broker or the consumer. An error makes the delivery poison: it is wrapped
// with idempotent.ErrInvalidEventTime unless it already matches it or
// ErrPoison.
type EventTimeFunc func(d *amqp.Delivery) (time.Time, error)

// A HandlerOption configures a Handler built by Process or Decode.
type HandlerOption interface {
	applyHandler(*handlerConfig) error
}

type handlerOptionFunc func(*handlerConfig) error

func (f handlerOptionFunc) applyHandler(c *handlerConfig) error { return f(c) }

// eventSource is where a Handler reads each delivery's event time.
type eventSource int

const (
	fromHeader    eventSource = iota // adapter.EventTimeHeader, the default
	fromFunc                         // WithEventTime
	fromTransport                    // WithTransportEventTime
)

type handlerConfig struct {
	source      eventSource
	eventTimeFn EventTimeFunc
	partitioned bool
}

// WithEventTime reads each delivery's event time with f, a function over
// the delivery (its body, or a header of the producer's own), instead of
// the adapter.EventTimeHeader header. f counts as a producer's event time:
// it is accepted in partitioned mode. A delivery for which f fails or
// returns the zero time is poison. Default is the header.
func WithEventTime(f EventTimeFunc) HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error {
		if f == nil {
			return errors.New("WithEventTime: nil function")
		}
		if c.source != fromHeader {
			return errors.New("WithEventTime: an event time source is already set")
		}
		c.source, c.eventTimeFn = fromFunc, f
		return nil
	})
}

// WithTransportEventTime reads each delivery's event time from the AMQP
// timestamp property (amqp091.Publishing.Timestamp, whole seconds) instead
// of the adapter.EventTimeHeader header. That is a transport time: a
// producer's re-send (an application retry, a relay resending after a lost
// confirm) stamps it anew, and so does a broker plugin that stamps messages
// on arrival. A re-send then gets a new event time — after midnight a new
// day — and the retention fence judges it by that time, not the event's.
// Because a re-send would land in another day's partition, where its first
// claim cannot be seen, and apply again, a Handler with this option is
// refused for a Middleware in partitioned mode (adapter.ErrNoProducerEventTime).
// A delivery without a timestamp fails with ErrNoEventTime and is poison.
// Default is the header.
func WithTransportEventTime() HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error {
		if c.source != fromHeader {
			return errors.New("WithTransportEventTime: an event time source is already set")
		}
		c.source = fromTransport
		return nil
	})
}

// newHandlerConfig applies opts for the Handler constructor fn and checks
// that a partitioned mw gets a producer's event time.
func newHandlerConfig(fn string, mw *idempotent.Middleware, opts []HandlerOption) (handlerConfig, error) {
	c := handlerConfig{partitioned: mw.Partitioned()}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("rabbitmq: %s: nil option", fn)
		}
		if err := o.applyHandler(&c); err != nil {
			return c, fmt.Errorf("rabbitmq: %s: %w", fn, err)
		}
	}
	if err := adapter.CheckEventTimeSource(mw, "rabbitmq: "+fn, c.source != fromTransport); err != nil {
		return c, fmt.Errorf("%w; WithTransportEventTime reads the AMQP timestamp, which a re-send stamps anew", err)
	}
	return c, nil
}

// eventTime returns d's event time, or zero when it has none and need not.
func (c *handlerConfig) eventTime(key string, d *amqp.Delivery) (time.Time, error) {
	switch c.source {
	case fromTransport:
		if d.Timestamp.IsZero() {
			return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w: the timestamp property is not set", key, ErrNoEventTime)
		}
		return d.Timestamp, nil
	case fromFunc:
		at, err := c.eventTimeFn(d)
		if err != nil {
			if errors.Is(err, idempotent.ErrInvalidEventTime) || errors.Is(err, ErrPoison) {
				return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w", key, err)
			}
			return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w: event time function: %w", key, idempotent.ErrInvalidEventTime, err)
		}
		if at.IsZero() {
			return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w: the event time function returned the zero time", key, ErrNoEventTime)
		}
		return at, nil
	}
	at, err := headerEventTime(d)
	if err != nil {
		return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w", key, err)
	}
	if at.IsZero() && c.partitioned {
		return time.Time{}, fmt.Errorf("rabbitmq: message %q: %w: no %s header, and the claim table is partitioned by event day", key, ErrNoEventTime, adapter.EventTimeHeader)
	}
	return at, nil
}

// headerEventTime reads the adapter.EventTimeHeader header: zero when it is
// absent, an error matching adapter.ErrBadEventTime when it is not an RFC
// 3339 string.
func headerEventTime(d *amqp.Delivery) (time.Time, error) {
	v, ok := d.Headers[adapter.EventTimeHeader]
	if !ok || v == nil {
		return time.Time{}, nil
	}
	switch v := v.(type) {
	case string:
		return adapter.ParseEventTime(v)
	case []byte:
		return adapter.ParseEventTime(string(v))
	}
	return time.Time{}, fmt.Errorf("%w: a %T, want a string as adapter.FormatEventTime writes it", adapter.ErrBadEventTime, v)
}
