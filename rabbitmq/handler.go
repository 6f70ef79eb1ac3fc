package rabbitmq

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
)

// A Handler processes one delivery and reports how it ended. It must not
// ack, nack or reject the delivery: the Consumer does, from the result. A nil
// error means the effect is durable (committed now, or found applied before),
// and the delivery is acked; an error that a poison predicate recognises
// dead-letters it; any other error requeues it.
//
// Process and Decode build Handlers that run each delivery through an
// idempotent.Middleware. A Handler of your own may do anything, as long as
// it returns nil only once its effect has committed.
type Handler func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error)

// Process returns a Handler that applies fn's effect for each delivery
// exactly once: it takes the message key from key, then calls mw.Process,
// which runs fn inside the claim's transaction if the key is new. A key
// error makes the delivery poison (it is wrapped with
// idempotent.ErrInvalidKey unless it already matches it or ErrPoison).
//
// With [WithEventTime], each delivery's event time is read too, and the
// delivery goes through mw.ProcessMessage: the retention fence applies, and in
// partitioned mode the claim lands in the event day's partition. A
// Middleware in partitioned mode (idempotent.WithDailyPartitions) needs
// WithEventTime.
//
// Process panics if an argument or option is nil, or if mw is in
// partitioned mode and no WithEventTime is given: mistakes in the program's
// set-up, which no delivery could get past.
func Process(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error, opts ...HandlerOption) Handler {
	if mw == nil || key == nil || fn == nil {
		panic("rabbitmq: Process: nil middleware, key function or handler")
	}
	cfg := newHandlerConfig("Process", mw, opts)
	return func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		k, err := deliveryKey(key, d)
		if err != nil {
			return 0, err
		}
		at, err := cfg.eventTime(k, d)
		if err != nil {
			return 0, err
		}
		return cfg.process(ctx, mw, k, at, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, d) })
	}
}

// Decode returns a Handler that decodes each delivery's body into an M with
// decode and applies h's effect for it exactly once, keyed by key. A key
// error or a decode error (wrapped with ErrUndecodable) makes the delivery
// poison; neither opens a transaction. [JSON] is a ready-made decode
// function. With [WithEventTime] the delivery goes through
// mw.ProcessMessage, as with Process. Decode panics as Process does.
func Decode[M any](mw *idempotent.Middleware, key KeyFunc, decode func(body []byte) (M, error), h idempotent.Handler[M], opts ...HandlerOption) Handler {
	if mw == nil || key == nil || decode == nil || h == nil {
		panic("rabbitmq: Decode: nil middleware, key function, decode function or handler")
	}
	cfg := newHandlerConfig("Decode", mw, opts)
	return func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		k, err := deliveryKey(key, d)
		if err != nil {
			return 0, err
		}
		at, err := cfg.eventTime(k, d)
		if err != nil {
			return 0, err
		}
		msg, err := decode(d.Body)
		if err != nil {
			if errors.Is(err, ErrUndecodable) {
				return 0, fmt.Errorf("rabbitmq: message %q: %w", k, err)
			}
			return 0, fmt.Errorf("rabbitmq: message %q: %w: %w", k, ErrUndecodable, err)
		}
		return cfg.process(ctx, mw, k, at, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, msg) })
	}
}

// JSON decodes a JSON body into an M, for use with Decode. Fields of the
// body that M does not have are ignored, so producers can add fields without
// breaking consumers; data after the JSON value is an error.
func JSON[M any](body []byte) (M, error) {
	var m M
	if err := json.Unmarshal(body, &m); err != nil {
		var zero M
		return zero, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	return m, nil
}

func deliveryKey(key KeyFunc, d *amqp.Delivery) (string, error) {
	k, err := key(d)
	if err != nil {
		if errors.Is(err, idempotent.ErrInvalidKey) || errors.Is(err, ErrPoison) {
			return "", err
		}
		return "", fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
	}
	return k, nil
}
