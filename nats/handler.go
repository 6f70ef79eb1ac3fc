package nats

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
)

// A Handler processes one message and reports how it ended. It must not ack,
// nak or terminate the message: the Consumer does, from the result. A nil
// error means the effect is durable (committed now, or found applied
// before), and the message is acked; an error that a poison predicate
// recognises terminates it; any other error naks it with a delay.
//
// Process and Decode build Handlers that run each message through an
// idempotent.Middleware. A Handler of your own may do anything, as long as it
// returns nil only once its effect has committed.
type Handler func(ctx context.Context, msg jetstream.Msg) (idempotent.Outcome, error)

// A BatchHandler processes the messages of one fetch and reports, for each
// message at the same index, how it ended: outcomes[i] when errs[i] is nil.
// Both slices have len(msgs) elements. Like a Handler, it must not settle the
// messages itself. ProcessBatch and DecodeBatch build BatchHandlers.
type BatchHandler func(ctx context.Context, msgs []jetstream.Msg) (outcomes []idempotent.Outcome, errs []error)

// A HandlerOption configures a handler built by Process or Decode.
type HandlerOption interface {
	applyHandler(*handlerConfig) error
}

type handlerOptionFunc func(*handlerConfig) error

func (f handlerOptionFunc) applyHandler(c *handlerConfig) error { return f(c) }

type handlerConfig struct {
	eventTime TimeFunc
}

// WithEventTime makes the handler call idempotent's Middleware.ProcessMessage
// with the event time at returns, so that a message older than the
// middleware's retention window is refused (ErrBeyondRetention) and
// terminated instead of being applied again after its claim was cleaned up.
// The time must be set by the producer and be the same on every delivery:
// never the stream's timestamp, which a republish changes. An error from at
// makes the message poison. Default is no event time (Middleware.Process).
func WithEventTime(at TimeFunc) HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error {
		if at == nil {
			return errors.New("nats: WithEventTime: nil function")
		}
		c.eventTime = at
		return nil
	})
}

func handlerOptions(who string, opts []HandlerOption) handlerConfig {
	var c handlerConfig
	for _, o := range opts {
		if o == nil {
			panic("nats: " + who + ": nil option")
		}
		if err := o.applyHandler(&c); err != nil {
			panic(err)
		}
	}
	return c
}

// process runs fn through mw for msg with key k, with the event time if the
// handler has one.
func (c handlerConfig) process(ctx context.Context, mw *idempotent.Middleware, k string, msg jetstream.Msg, fn idempotent.TxFunc) (idempotent.Outcome, error) {
	if c.eventTime == nil {
		return mw.Process(ctx, k, fn)
	}
	at, err := c.eventTime(msg)
	if err == nil && at.IsZero() {
		err = fmt.Errorf("%w: the event time function returned the zero time", idempotent.ErrInvalidEventTime)
	}
	if err != nil {
		if !errors.Is(err, idempotent.ErrInvalidEventTime) && !errors.Is(err, ErrPoison) {
			err = fmt.Errorf("%w: %w", idempotent.ErrInvalidEventTime, err)
		}
		return 0, fmt.Errorf("nats: message %q: event time: %w", k, err)
	}
	return mw.ProcessMessage(ctx, idempotent.Message{Key: k, EventTime: at}, fn)
}

// Process returns a Handler that applies fn's effect for each message exactly
// once: it takes the message key from key (MsgID when nil), then calls
// mw.Process, which runs fn inside the claim's transaction if the key is new.
// A key error makes the message poison. Process panics if mw or fn is nil or
// an option is invalid.
func Process(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error, opts ...HandlerOption) Handler {
	if mw == nil || fn == nil {
		panic("nats: Process: nil middleware or handler")
	}
	if key == nil {
		key = MsgID()
	}
	cfg := handlerOptions("Process", opts)
	return func(ctx context.Context, msg jetstream.Msg) (idempotent.Outcome, error) {
		k, err := msgKey(key, msg)
		if err != nil {
			return 0, err
		}
		return cfg.process(ctx, mw, k, msg, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, msg) })
	}
}

// Decode returns a Handler that decodes each message's data into an M with
// decode and applies h's effect for it exactly once, keyed by key (MsgID
// when nil). A key error or a decode error (wrapped with ErrUndecodable)
// makes the message poison; neither opens a transaction. [JSON] is a
// ready-made decode function. Decode panics if mw, decode or h is nil or an
// option is invalid.
func Decode[M any](mw *idempotent.Middleware, key KeyFunc, decode func(data []byte) (M, error), h idempotent.Handler[M], opts ...HandlerOption) Handler {
	if mw == nil || decode == nil || h == nil {
		panic("nats: Decode: nil middleware, decode function or handler")
	}
	if key == nil {
		key = MsgID()
	}
	cfg := handlerOptions("Decode", opts)
	return func(ctx context.Context, msg jetstream.Msg) (idempotent.Outcome, error) {
		k, err := msgKey(key, msg)
		if err != nil {
			return 0, err
		}
		m, err := decodeData(k, decode, msg)
		if err != nil {
			return 0, err
		}
		return cfg.process(ctx, mw, k, msg, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, m) })
	}
}

// ProcessBatch returns a BatchHandler that applies the effects of a fetched
// batch exactly once, in one transaction, with mw.ProcessBatch: fn runs once
// with the messages whose claims were new, in their order in the batch.
// Messages whose key fails are set aside as poison first; the rest go
// through the batch. If the batch's transaction fails, every message is
// tried again on its own (a batch of one), so that one poison message is
// terminated without holding back the others. key is MsgID when nil.
// Event times (WithEventTime) need Process or Decode: a batch carries none.
// ProcessBatch panics if mw or fn is nil.
func ProcessBatch(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error) BatchHandler {
	if mw == nil || fn == nil {
		panic("nats: ProcessBatch: nil middleware or handler")
	}
	return batchHandler(mw, key, func([]byte) (struct{}, error) { return struct{}{}, nil },
		func(ctx context.Context, tx *sql.Tx, msgs []decoded[struct{}]) error {
			raw := make([]jetstream.Msg, len(msgs))
			for i, m := range msgs {
				raw[i] = m.Msg
			}
			return fn(ctx, tx, raw)
		})
}

// decoded pairs a message with its decoded data.
type decoded[M any] struct {
	Msg  jetstream.Msg
	Data M
}

// DecodeBatch is ProcessBatch for decoded messages: it decodes each message's
// data with decode and calls h once with the new messages' decoded values,
// in their order in the batch. A key or decode error makes that message
// poison. key is MsgID when nil. DecodeBatch panics if mw, decode or h is
// nil.
func DecodeBatch[M any](mw *idempotent.Middleware, key KeyFunc, decode func(data []byte) (M, error), h idempotent.BatchHandler[M]) BatchHandler {
	if mw == nil || decode == nil || h == nil {
		panic("nats: DecodeBatch: nil middleware, decode function or handler")
	}
	return batchHandler(mw, key, decode, func(ctx context.Context, tx *sql.Tx, msgs []decoded[M]) error {
		vals := make([]M, len(msgs))
		for i, m := range msgs {
			vals[i] = m.Data
		}
		return h(ctx, tx, vals)
	})
}

// batchHandler is the one implementation behind ProcessBatch and DecodeBatch.
func batchHandler[M any](mw *idempotent.Middleware, key KeyFunc, decode func(data []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, msgs []decoded[M]) error) BatchHandler {
	if key == nil {
		key = MsgID()
	}
	run := func(ctx context.Context, keys []string, items []decoded[M]) ([]idempotent.Outcome, error) {
		return mw.ProcessBatch(ctx, keys, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			sel := make([]decoded[M], len(fresh))
			for j, i := range fresh {
				sel[j] = items[i]
			}
			return h(ctx, tx, sel)
		})
	}
	return func(ctx context.Context, msgs []jetstream.Msg) ([]idempotent.Outcome, []error) {
		outcomes := make([]idempotent.Outcome, len(msgs))
		errs := make([]error, len(msgs))
		var keys []string
		var items []decoded[M]
		var index []int // index[j]: the batch index of keys[j]
		for i, msg := range msgs {
			k, err := msgKey(key, msg)
			if err == nil {
				var m M
				if m, err = decodeData(k, decode, msg); err == nil {
					keys = append(keys, k)
					items = append(items, decoded[M]{msg, m})
					index = append(index, i)
					continue
				}
			}
			errs[i] = err
		}
		if len(keys) == 0 {
			return outcomes, errs
		}
		out, err := run(ctx, keys, items)
		if err == nil {
			for j, i := range index {
				outcomes[i] = out[j]
			}
			return outcomes, errs
		}
		if len(keys) == 1 || ctx.Err() != nil {
			for _, i := range index {
				errs[i] = err
			}
			return outcomes, errs
		}
		// One message may have failed the batch: try each on its own.
		for j, i := range index {
			out, err := run(ctx, keys[j:j+1], items[j:j+1])
			if err != nil {
				errs[i] = err
				continue
			}
			outcomes[i] = out[0]
		}
		return outcomes, errs
	}
}

// JSON decodes a JSON message into an M, for use with Decode. Fields of the
// data that M does not have are ignored, so producers can add fields without
// breaking consumers.
func JSON[M any](data []byte) (M, error) {
	var m M
	if err := json.Unmarshal(data, &m); err != nil {
		var zero M
		return zero, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	return m, nil
}

func msgKey(key KeyFunc, msg jetstream.Msg) (string, error) {
	k, err := key(msg)
	if err != nil {
		if errors.Is(err, idempotent.ErrInvalidKey) || errors.Is(err, ErrPoison) {
			return "", err
		}
		return "", fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
	}
	return k, nil
}

func decodeData[M any](k string, decode func([]byte) (M, error), msg jetstream.Msg) (M, error) {
	m, err := decode(msg.Data())
	if err != nil {
		if errors.Is(err, ErrUndecodable) {
			return m, fmt.Errorf("nats: message %q: %w", k, err)
		}
		return m, fmt.Errorf("nats: message %q: %w: %w", k, ErrUndecodable, err)
	}
	return m, nil
}
