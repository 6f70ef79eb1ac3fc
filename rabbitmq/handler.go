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
// and the delivery is acked; any other error is settled by the one settle
// rule, adapter.Rule.Settle (see the package documentation).
//
// Process and Decode build Handlers that run each delivery through an
// idempotent.Middleware; their errors carry the message's event time and
// the Middleware's clock to the rule. A Handler of your own may do
// anything, as long as it returns nil only once its effect has committed;
// the rule then reads its errors with time.Now and no event time, so an
// idempotent.ErrInvalidEventTime of its own is poison, never requeued.
type Handler func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error)

// Process returns a Handler that applies fn's effect for each delivery
// exactly once: it takes the message key from key and the event time from
// the adapter.EventTimeHeader header (see [WithEventTime] and
// [WithTransportEventTime] for other sources), then calls
// mw.ProcessMessage, which runs fn inside the claim's transaction if the key
// is new. A key error makes the delivery poison (it is wrapped with
// idempotent.ErrInvalidKey unless it already matches it or ErrPoison).
//
// A delivery with an event time meets the retention fence, and in
// partitioned mode its claim lands in the event day's partition. Without
// one — the producer set no header — the fence cannot apply, and in
// partitioned mode (idempotent.WithDailyPartitions) the delivery is poison
// (ErrNoEventTime). A header that is not an RFC 3339 time is poison
// (adapter.ErrBadEventTime).
//
// Process returns an error, and no Handler, if an argument or option is nil
// or if mw is in partitioned mode and the event time would come from the
// transport (WithTransportEventTime): an error matching
// adapter.ErrNoProducerEventTime.
func Process(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error, opts ...HandlerOption) (Handler, error) {
	if mw == nil || key == nil || fn == nil {
		return nil, errors.New("rabbitmq: Process: nil middleware, key function or handler")
	}
	cfg, err := newHandlerConfig("Process", mw, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		msg, err := cfg.message(key, d)
		if err != nil {
			return 0, &handlerError{msg: msg, mw: mw, err: err}
		}
		return cfg.process(ctx, mw, msg, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, d) })
	}, nil
}

// Decode returns a Handler that decodes each delivery's body into an M with
// decode and applies h's effect for it exactly once, keyed by key, with the
// event time read as Process reads it. A key error, an event-time error or
// a decode error (wrapped with ErrUndecodable) makes the delivery poison;
// none opens a transaction. [JSON] is a ready-made decode function. Decode
// returns an error as Process does.
func Decode[M any](mw *idempotent.Middleware, key KeyFunc, decode func(body []byte) (M, error), h idempotent.Handler[M], opts ...HandlerOption) (Handler, error) {
	if mw == nil || key == nil || decode == nil || h == nil {
		return nil, errors.New("rabbitmq: Decode: nil middleware, key function, decode function or handler")
	}
	cfg, err := newHandlerConfig("Decode", mw, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		msg, err := cfg.message(key, d)
		if err != nil {
			return 0, &handlerError{msg: msg, mw: mw, err: err}
		}
		m, err := decode(d.Body)
		if err != nil {
			if !errors.Is(err, ErrUndecodable) {
				err = fmt.Errorf("%w: %w", ErrUndecodable, err)
			}
			return 0, &handlerError{msg: msg, mw: mw, err: fmt.Errorf("rabbitmq: message %q: %w", msg.Key, err)}
		}
		return cfg.process(ctx, mw, msg, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, m) })
	}, nil
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

// message reads d's key and event time.
func (c *handlerConfig) message(key KeyFunc, d *amqp.Delivery) (idempotent.Message, error) {
	k, err := deliveryKey(key, d)
	if err != nil {
		return idempotent.Message{}, err
	}
	at, err := c.eventTime(k, d)
	if err != nil {
		return idempotent.Message{Key: k}, err
	}
	return idempotent.Message{Key: k, EventTime: at}, nil
}

// process runs fn for msg through mw. An error carries msg and mw to the
// Consumer's settle rule.
func (c *handlerConfig) process(ctx context.Context, mw *idempotent.Middleware, msg idempotent.Message, fn idempotent.TxFunc) (idempotent.Outcome, error) {
	out, err := mw.ProcessMessage(ctx, msg, fn)
	if err != nil {
		return out, &handlerError{msg: msg, mw: mw, err: err}
	}
	return out, nil
}

// handlerError is an error of a Handler built by Process or Decode: it
// carries the message (its event time, for a future-dated one) and the
// Middleware (its clock and clock-skew margin) to the settle rule.
type handlerError struct {
	msg idempotent.Message
	mw  *idempotent.Middleware
	err error
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }
