package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
)

// ErrNoEventTime reports a delivery that carries no event time where its
// EventTimeFunc looks, such as a zero timestamp property. It matches
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

// Timestamp returns an EventTimeFunc that reads the AMQP timestamp
// property, set by the producer in amqp091.Publishing.Timestamp (to the
// second: AMQP timestamps carry no fraction). A delivery without one fails
// with ErrNoEventTime. Do not let the broker stamp it on arrival (as
// RabbitMQ's message-timestamp plugin can): a message republished from a
// dead-letter queue would then carry a new time, and in partitioned mode
// land on another day, where its claim is not.
func Timestamp() EventTimeFunc {
	return func(d *amqp.Delivery) (time.Time, error) {
		if d.Timestamp.IsZero() {
			return time.Time{}, fmt.Errorf("%w: the timestamp property is not set", ErrNoEventTime)
		}
		return d.Timestamp, nil
	}
}

// A HandlerOption configures a Handler built by Process or Decode.
type HandlerOption interface {
	applyHandler(*handlerConfig)
}

type handlerOptionFunc func(*handlerConfig)

func (f handlerOptionFunc) applyHandler(c *handlerConfig) { f(c) }

type handlerConfig struct {
	eventTimeSet bool
	eventTimeFn  EventTimeFunc
}

// WithEventTime reads each delivery's event time with f (such as
// [Timestamp]) and processes the delivery with
// idempotent.Middleware.ProcessMessage instead of Process: a message older
// than the retention window is refused with idempotent.ErrBeyondRetention
// and dead-lettered instead of being applied a second time after its claim
// was cleaned up; one whose event time cannot be read, is zero or lies in
// the future is poison too; in partitioned mode the claim goes to the event
// day's partition, and a day whose partition does not exist yet fails with
// idempotent.ErrNoPartition, which requeues the delivery. Required when the
// Middleware is in partitioned mode. Default is no event time
// (Middleware.Process).
func WithEventTime(f EventTimeFunc) HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) {
		c.eventTimeSet = true
		c.eventTimeFn = f
	})
}

// newHandlerConfig applies opts for the Handler constructor fn, panicking
// on a mistake in the set-up.
func newHandlerConfig(fn string, mw *idempotent.Middleware, opts []HandlerOption) handlerConfig {
	var c handlerConfig
	for _, o := range opts {
		if o == nil {
			panic("rabbitmq: " + fn + ": nil option")
		}
		o.applyHandler(&c)
	}
	if c.eventTimeSet && c.eventTimeFn == nil {
		panic("rabbitmq: " + fn + ": WithEventTime: nil function")
	}
	if !c.eventTimeSet && mw.Partitioned() {
		panic(fmt.Sprintf("rabbitmq: %s: the claim table %s is partitioned by event day, so every delivery needs its event time: add WithEventTime (for the AMQP timestamp property, WithEventTime(Timestamp()))", fn, mw.Table()))
	}
	return c
}

// eventTime returns d's event time, or zero when the Handler has no
// EventTimeFunc.
func (c *handlerConfig) eventTime(key string, d *amqp.Delivery) (time.Time, error) {
	if c.eventTimeFn == nil {
		return time.Time{}, nil
	}
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

// process runs fn for key through mw: ProcessMessage with the event time when the Handler reads
// event times, Process otherwise.
func (c *handlerConfig) process(ctx context.Context, mw *idempotent.Middleware, key string, at time.Time, fn idempotent.TxFunc) (idempotent.Outcome, error) {
	if c.eventTimeFn == nil {
		return mw.Process(ctx, key, fn)
	}
	return mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, fn)
}
