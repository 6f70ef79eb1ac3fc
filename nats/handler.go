package nats

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// A Handler processes one message and reports how it ended. It must not ack,
// nak or terminate the message: the Consumer does, from the result. A nil
// error means the effect is durable (committed now, or found applied
// before), and the message is acked; an error is settled by
// adapter.Rule.Settle (see the package documentation): terminated when it
// is poison, naked with a delay otherwise. An event-time error of a Handler
// of your own is poison, since the rule cannot know the message's event
// time; Process and Decode give it.
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

// A HandlerOption configures a handler built by Process, Decode,
// ProcessBatch or DecodeBatch: where it reads each message's event time.
type HandlerOption interface {
	applyHandler(*handlerConfig) error
}

type handlerOptionFunc func(*handlerConfig) error

func (f handlerOptionFunc) applyHandler(c *handlerConfig) error { return f(c) }

// timeSource is where a handler reads a message's event time.
type timeSource int

const (
	fromHeader    timeSource = iota // adapter.EventTimeHeader, the default
	fromFunc                        // WithEventTime
	fromTransport                   // WithTransportEventTime
	fromNothing                     // WithoutEventTime
)

type handlerConfig struct {
	source    timeSource
	chosen    string // the option that chose source, "" for the default
	eventTime TimeFunc
}

func (c *handlerConfig) choose(option string, s timeSource) error {
	if c.chosen != "" {
		return fmt.Errorf("nats: %s and %s both choose the event time: give one", c.chosen, option)
	}
	c.source, c.chosen = s, option
	return nil
}

// WithEventTime makes the handler read each message's event time with at
// instead of the default, the [adapter.EventTimeHeader] header: a field of
// the data, or a header of another name ([TimeHeader]). The time must be
// set by the producer and be the same on every delivery: never the
// stream's timestamp, which a republish changes (see
// WithTransportEventTime). An error from at, or the zero time, makes the
// message poison. It counts as a producer event time, so a partitioned
// Middleware accepts it.
func WithEventTime(at TimeFunc) HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error {
		if at == nil {
			return errors.New("nats: WithEventTime: nil function")
		}
		c.eventTime = at
		return c.choose("WithEventTime", fromFunc)
	})
}

// WithTransportEventTime makes the handler take each message's event time
// from JetStream: the time the stream stored the message (its metadata
// timestamp). That is not the producer's time: a message published again —
// an application retry, an outbox relay resending after a lost PubAck
// outside the duplicate window, a republish from another stream — gets a
// new one, so on a day-partitioned claim table a re-send after UTC midnight
// lands in another day's partition, where its first claim cannot be seen,
// and is applied again; and the retention fence cannot recognise an old
// message republished. Use it only where every message is published once;
// a Middleware partitioned by event day is refused with it
// (adapter.ErrNoProducerEventTime), as by every adapter. Default is the
// adapter.EventTimeHeader header.
func WithTransportEventTime() HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error { return c.choose("WithTransportEventTime", fromTransport) })
}

// WithoutEventTime makes the handler read no event time: each message is
// claimed by its key alone, with no retention fence, even when it carries
// the adapter.EventTimeHeader header. A Middleware in partitioned mode
// needs event times, so the constructor refuses this option for one (an
// error matching adapter.ErrNoProducerEventTime). Default is the
// adapter.EventTimeHeader header.
func WithoutEventTime() HandlerOption {
	return handlerOptionFunc(func(c *handlerConfig) error { return c.choose("WithoutEventTime", fromNothing) })
}

// handlerOptions checks the options of constructor who for mw.
func handlerOptions(who string, mw *idempotent.Middleware, opts []HandlerOption) (handlerConfig, error) {
	var c handlerConfig
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("nats: %s: nil option", who)
		}
		if err := o.applyHandler(&c); err != nil {
			return c, err
		}
	}
	// The stream's timestamp is no producer's time: refused for a
	// partitioned table, as by every adapter.
	if err := adapter.CheckEventTimeSource(mw, "nats: "+who, c.source != fromNothing && c.source != fromTransport); err != nil {
		return c, err
	}
	return c, nil
}

// message returns what the Middleware needs of msg, whose key is k: the key
// and the event time from the handler's source (zero when it has none).
func (c handlerConfig) message(k string, msg jetstream.Msg) (idempotent.Message, error) {
	m := idempotent.Message{Key: k}
	var err error
	switch c.source {
	case fromHeader:
		m.EventTime, err = adapter.ParseEventTime(msg.Headers().Get(adapter.EventTimeHeader))
	case fromFunc:
		m.EventTime, err = c.eventTime(msg)
		if err == nil && m.EventTime.IsZero() {
			err = fmt.Errorf("%w: the event time function returned the zero time", idempotent.ErrInvalidEventTime)
		}
		if err != nil && !errors.Is(err, idempotent.ErrInvalidEventTime) && !errors.Is(err, ErrPoison) {
			err = fmt.Errorf("%w: %w", idempotent.ErrInvalidEventTime, err)
		}
	case fromTransport:
		var md *jetstream.MsgMetadata
		if md, err = msg.Metadata(); err == nil {
			m.EventTime = md.Timestamp
		} else {
			err = fmt.Errorf("%w: no stream timestamp: %w", idempotent.ErrInvalidEventTime, err)
		}
	}
	if err != nil {
		return idempotent.Message{Key: k}, fmt.Errorf("nats: message %q: event time: %w", k, err)
	}
	return m, nil
}

// claimError is an error of a handler built by this package, with what the
// settle rule needs to know of the delivery: the message as the Middleware
// was given it, and the Middleware (its clock and clock-skew margin).
type claimError struct {
	mw  *idempotent.Middleware
	msg idempotent.Message
	err error
}

func (e *claimError) Error() string { return e.err.Error() }
func (e *claimError) Unwrap() error { return e.err }

// settleInfo wraps a non-nil err with mw and msg for the settle rule.
func settleInfo(mw *idempotent.Middleware, msg idempotent.Message, err error) error {
	if err == nil {
		return nil
	}
	return &claimError{mw: mw, msg: msg, err: err}
}

// process runs fn through mw for msg, whose key is k, with its event time.
func (c handlerConfig) process(ctx context.Context, mw *idempotent.Middleware, k string, msg jetstream.Msg, fn idempotent.TxFunc) (idempotent.Outcome, error) {
	m, err := c.message(k, msg)
	if err != nil {
		return 0, settleInfo(mw, m, err)
	}
	out, err := mw.ProcessMessage(ctx, m, fn)
	return out, settleInfo(mw, m, err)
}

// Process returns a Handler that applies fn's effect for each message exactly
// once: it takes the message key from key (MsgID when nil) and the event
// time from the adapter.EventTimeHeader header (or as opts say), then calls
// mw.ProcessMessage, which runs fn inside the claim's transaction if the key
// is new. A key error makes the message poison. Process fails if mw or fn is
// nil, an option is invalid, or mw is in partitioned mode and opts leave
// the handler without an event time (adapter.ErrNoProducerEventTime).
func Process(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error, opts ...HandlerOption) (Handler, error) {
	if mw == nil || fn == nil {
		return nil, errors.New("nats: Process: nil middleware or handler")
	}
	if key == nil {
		key = MsgID()
	}
	cfg, err := handlerOptions("Process", mw, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, msg jetstream.Msg) (idempotent.Outcome, error) {
		k, err := msgKey(key, msg)
		if err != nil {
			return 0, err
		}
		return cfg.process(ctx, mw, k, msg, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, msg) })
	}, nil
}

// Decode returns a Handler that decodes each message's data into an M with
// decode and applies h's effect for it exactly once, keyed by key (MsgID
// when nil), with the event time of the adapter.EventTimeHeader header (or
// as opts say). A key error or a decode error (wrapped with ErrUndecodable)
// makes the message poison; neither opens a transaction. [JSON] is a
// ready-made decode function. Decode fails as Process does.
func Decode[M any](mw *idempotent.Middleware, key KeyFunc, decode func(data []byte) (M, error), h idempotent.Handler[M], opts ...HandlerOption) (Handler, error) {
	if mw == nil || decode == nil || h == nil {
		return nil, errors.New("nats: Decode: nil middleware, decode function or handler")
	}
	if key == nil {
		key = MsgID()
	}
	cfg, err := handlerOptions("Decode", mw, opts)
	if err != nil {
		return nil, err
	}
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
	}, nil
}

// ProcessBatch returns a BatchHandler that applies the effects of a fetched
// batch exactly once, in one transaction, with mw.ProcessMessages: fn runs
// once with the messages whose claims were new, in their order in the
// batch. Each message's event time is read as for Process (opts). Messages
// whose key or event time fails, or that the Middleware would refuse
// (mw.CheckMessage: too old, dated in the future), are set aside first and
// settled on their own; the rest go through the batch. If the batch's
// transaction fails, every message is tried again on its own (a batch of
// one), so that one poison message is terminated without holding back the
// others. key is MsgID when nil. ProcessBatch fails as Process does.
func ProcessBatch(mw *idempotent.Middleware, key KeyFunc, fn func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error, opts ...HandlerOption) (BatchHandler, error) {
	if mw == nil || fn == nil {
		return nil, errors.New("nats: ProcessBatch: nil middleware or handler")
	}
	cfg, err := handlerOptions("ProcessBatch", mw, opts)
	if err != nil {
		return nil, err
	}
	return batchHandler(mw, key, cfg, func([]byte) (struct{}, error) { return struct{}{}, nil },
		func(ctx context.Context, tx *sql.Tx, msgs []decoded[struct{}]) error {
			raw := make([]jetstream.Msg, len(msgs))
			for i, m := range msgs {
				raw[i] = m.Msg
			}
			return fn(ctx, tx, raw)
		}), nil
}

// decoded pairs a message with its decoded data.
type decoded[M any] struct {
	Msg  jetstream.Msg
	Data M
}

// DecodeBatch is ProcessBatch for decoded messages: it decodes each message's
// data with decode and calls h once with the new messages' decoded values,
// in their order in the batch. A key or decode error makes that message
// poison. key is MsgID when nil. DecodeBatch fails as Process does.
func DecodeBatch[M any](mw *idempotent.Middleware, key KeyFunc, decode func(data []byte) (M, error), h idempotent.BatchHandler[M], opts ...HandlerOption) (BatchHandler, error) {
	if mw == nil || decode == nil || h == nil {
		return nil, errors.New("nats: DecodeBatch: nil middleware, decode function or handler")
	}
	cfg, err := handlerOptions("DecodeBatch", mw, opts)
	if err != nil {
		return nil, err
	}
	return batchHandler(mw, key, cfg, decode, func(ctx context.Context, tx *sql.Tx, msgs []decoded[M]) error {
		vals := make([]M, len(msgs))
		for i, m := range msgs {
			vals[i] = m.Data
		}
		return h(ctx, tx, vals)
	}), nil
}

// batchHandler is the one implementation behind ProcessBatch and DecodeBatch.
func batchHandler[M any](mw *idempotent.Middleware, key KeyFunc, cfg handlerConfig, decode func(data []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, msgs []decoded[M]) error) BatchHandler {
	if key == nil {
		key = MsgID()
	}
	run := func(ctx context.Context, claims []idempotent.Message, items []decoded[M]) ([]idempotent.Outcome, error) {
		return mw.ProcessMessages(ctx, claims, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			sel := make([]decoded[M], len(fresh))
			for j, i := range fresh {
				sel[j] = items[i]
			}
			return h(ctx, tx, sel)
		})
	}
	// prepare returns what the batch needs of msg, or why msg cannot join it.
	prepare := func(msg jetstream.Msg) (idempotent.Message, M, error) {
		var m M
		k, err := msgKey(key, msg)
		if err != nil {
			return idempotent.Message{}, m, err
		}
		claim, err := cfg.message(k, msg)
		if err == nil {
			m, err = decodeData(k, decode, msg)
		}
		if err == nil {
			err = mw.CheckMessage(claim)
		}
		return claim, m, settleInfo(mw, claim, err)
	}
	return func(ctx context.Context, msgs []jetstream.Msg) ([]idempotent.Outcome, []error) {
		outcomes := make([]idempotent.Outcome, len(msgs))
		errs := make([]error, len(msgs))
		var claims []idempotent.Message
		var items []decoded[M]
		var index []int // index[j]: the batch index of claims[j]
		for i, msg := range msgs {
			claim, m, err := prepare(msg)
			if err != nil {
				errs[i] = err
				continue
			}
			claims = append(claims, claim)
			items = append(items, decoded[M]{msg, m})
			index = append(index, i)
		}
		if len(claims) == 0 {
			return outcomes, errs
		}
		out, err := run(ctx, claims, items)
		if err == nil {
			for j, i := range index {
				outcomes[i] = out[j]
			}
			return outcomes, errs
		}
		if len(claims) == 1 || ctx.Err() != nil {
			for j, i := range index {
				errs[i] = settleInfo(mw, claims[j], err)
			}
			return outcomes, errs
		}
		// One message may have failed the batch: try each on its own.
		for j, i := range index {
			out, err := run(ctx, claims[j:j+1], items[j:j+1])
			if err != nil {
				errs[i] = settleInfo(mw, claims[j], err)
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
