package nats

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// An Option configures a Consumer. Options are checked by NewConsumer and
// NewBatchConsumer: a bad value is an error from the constructor, never a
// surprise at the first message.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// MaxFetch is the most messages one pull request asks for (WithFetchSize,
// WithBatchSize). It is idempotent.MaxBatchSize, the most one claim
// transaction takes.
const MaxFetch = idempotent.MaxBatchSize

// Defaults of the options of this package's own.
const (
	// DefaultFetchSize is how many messages a worker of a per-message
	// Consumer asks for in one pull request (WithFetchSize).
	DefaultFetchSize = 8
	// DefaultBatchSize is the most messages a batch Consumer hands its
	// handler at once (WithBatchSize).
	DefaultBatchSize = 100
	// DefaultFetchWait is how long a pull request waits for messages
	// (WithFetchWait).
	DefaultFetchWait = time.Second
)

type config struct {
	adapter.Config[jetstream.Msg]
	fetchSize   int // 0 until WithFetchSize
	batchSize   int // 0 until WithBatchSize
	fetchWait   time.Duration
	deadLetter  *outbox.Outbox // nil until WithDeadLetter
	deadSubject string
}

// newConfig applies opts for constructor who, and checks the result for mw.
func newConfig(who string, mw *idempotent.Middleware, opts []Option) (config, error) {
	c := config{Config: adapter.NewConfig(transport), fetchWait: DefaultFetchWait}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("nats: %s: nil option", who)
		}
		if err := o.apply(&c); err != nil {
			return c, fmt.Errorf("nats: %s: %w", who, err)
		}
	}
	// Check's errors name the adapter ("nats: …") already.
	if err := c.Check(mw); err != nil {
		return c, err
	}
	return c, nil
}

// WithTenant routes each message to its tenant's Middleware in ts, for a
// consumer whose tenants each have a database of their own: tenant names
// the message's tenant (from a header or the body). The constructors are
// then given a nil Middleware. A batch is split by tenant, each tenant's
// part claimed and committed in a transaction of its own; a tenant whose
// database is down has its messages redelivered while the others are
// acked; a message whose tenant cannot be read is poison. See
// adapter.Config.SetTenant. Default: no tenants.
func WithTenant(ts *idempotent.Tenants, tenant func(m jetstream.Msg) (string, error)) Option {
	return optionFunc(func(c *config) error { return c.SetTenant(ts, tenant) })
}

// WithKey sets how the key of each message is read: MsgID (the default),
// Header, BodyField, Prefixed, or a KeyFunc of your own. Default is MsgID().
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return c.SetKey(k) })
}

// WithEventTime makes the Consumer read each message's event time with at
// instead of the default, the [adapter.EventTimeHeader] header: a field of
// the data, or a header of another name ([TimeHeader]). The time must be
// set by the producer and be the same on every delivery: never the
// stream's timestamp, which a republish changes (see
// WithTransportEventTime). An error from at, or the zero time, makes the
// message poison. It counts as a producer's event time, so a partitioned
// Middleware accepts it. Default is the adapter.EventTimeHeader header.
func WithEventTime(at EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return c.SetEventTime(at) })
}

// WithTransportEventTime makes the Consumer take each message's event time
// from JetStream: the time the stream stored the message (its metadata
// timestamp). That is not the producer's time: a message published again —
// an application retry, an outbox relay resending after a lost PubAck
// outside the duplicate window, a republish from another stream — gets a
// new one, so on a day-partitioned claim table a re-send after UTC
// midnight would land in another day's partition, where its first claim
// cannot be seen, and be applied again; and the retention fence cannot
// recognise an old message republished. Use it only where every message
// is published once; a Middleware partitioned by event day refuses it
// (adapter.ErrNoProducerEventTime). Default is the adapter.EventTimeHeader
// header.
func WithTransportEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetTransportEventTime() })
}

// WithoutEventTime makes the Consumer read no event time: each message is
// claimed by its key alone, with no retention fence, even when it carries
// the adapter.EventTimeHeader header. A Middleware in partitioned mode
// needs event times, so the constructors refuse this option for one (an
// error matching adapter.ErrNoProducerEventTime). Default is the
// adapter.EventTimeHeader header.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetNoEventTime() })
}

// WithObserver sets the Observer told of every settlement — one
// adapter.Event of type EventApplied, EventDuplicate, EventRequeued,
// EventDeadLettered or EventReleased per delivery, with Detail the
// jetstream.Msg — and, in addition, of every ack, nak or term the server
// could not be sent (EventSettleFailed) and every failed pull request that
// Run retries (EventFetchError). Observe runs on the worker's goroutine,
// after the server was told; it must be safe for concurrent use and return
// quickly. Consumer.Stats counts the same events. Default is none.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return c.SetObserver(o) })
}

// WithTracer traces the deliveries with t (package oteltrace gives one):
// each delivery's transaction, or each batch's, is a span that continues
// the trace of the producer whose context the deliveries carry in their
// headers (fields, for a stream entry). Default is none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return c.SetTracer(t) })
}

// WithRetryDelay sets the redelivery delay of a message whose handler
// failed with an error that is not poison: the Consumer naks it with the
// delay adapter.Rule.Settle gives, idempotent.RetryPolicy.Backoff of the
// server's delivery count (NumDelivered) — initial after the first
// delivery, doubling with each further one up to max, each drawn at random
// from the upper half of its value. (A message dated in the future waits
// at least until the clock catches up.) The delay keeps a failing message
// from spinning between the server and the consumer; the number of
// deliveries is bounded by the consumer's MaxDeliver, after which the
// server stops redelivering it (and sends a MAX_DELIVERIES advisory). It
// must hold 0 < initial <= max. Default is idempotent.DefaultRetryPolicy's
// backoff.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetRetryDelay(initial, max) })
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) a message's event time may be and the message be
// naked until the clock catches up; a message dated further ahead is
// terminated. It must be positive. Default is adapter.DefaultFutureBound.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetFutureBound(d) })
}

// WithWorkers sets how many goroutines pull and process messages at once,
// each with its own pull requests and (through the Middleware) its own
// database connection: size the pool for it. It must be 1 to
// adapter.MaxWorkers. Default is adapter.DefaultWorkers.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return c.SetWorkers(n) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends,
// for in-flight messages to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the messages are
// redelivered, to be applied then. It must be positive. Default is
// adapter.DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetShutdownTimeout(d) })
}

// WithPoison marks more of a handler's errors as poison: an error for
// which isPoison returns true terminates the message instead of naking it.
// Errors matching adapter.ErrPoison (adapter.Poison, adapter.ErrUndecodable)
// are poison without it. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return c.SetPoison(isPoison) })
}

// WithFetchSize sets how many messages a worker of a per-message Consumer
// (NewConsumer) asks for in one pull request; it handles them one after
// the other, each in its own transaction, as they arrive. Messages wait in
// the worker while earlier ones are handled, so keep n times the handler's
// duration well under the consumer's AckWait. It must be 1 to MaxFetch,
// and is refused by NewBatchConsumer, whose WithBatchSize plays this part.
// Default is DefaultFetchSize.
func WithFetchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxFetch {
			return fmt.Errorf("WithFetchSize: %d, want 1 to %d", n, MaxFetch)
		}
		c.fetchSize = n
		return nil
	})
}

// WithBatchSize sets the most messages a worker of a batch Consumer
// (NewBatchConsumer) asks for in one pull request and hands its
// BatchHandler at once, in one transaction. It must be 1 to MaxFetch, and
// is refused by NewConsumer. Default is DefaultBatchSize.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxFetch {
			return fmt.Errorf("WithBatchSize: %d, want 1 to %d", n, MaxFetch)
		}
		c.batchSize = n
		return nil
	})
}

// WithFetchWait sets how long a pull request stays open waiting for
// messages. A batch Consumer handles what arrived when it expires (or as
// soon as the batch is full); a shutdown waits for the open requests to
// expire, handing back (nak) what arrives meanwhile. It must be 1ms to one
// minute. Default is DefaultFetchWait.
func WithFetchWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("WithFetchWait: %v, want 1ms to 1m", d)
		}
		c.fetchWait = d
		return nil
	})
}

// WithDeadLetter dead-letters poison messages to subject through ob, in
// place of terminating them and nothing else: the Consumer writes an
// outbox row of kind DeadLetterKind holding the message (subject, headers,
// data), the error and the server's delivery count, with the event time it
// read (outbox.WithEventTime), in a transaction of the Middleware's, and
// terminates the message once it committed; if the write fails, the message
// is naked and dead-lettered on a later delivery. A relay with
// DeadLetterSender for that kind publishes it to subject. The rows are what
// package deadletter and "idempotent dead-letters" list, show, replay
// (ReplaySender) and discard. The outbox is Postgres only: the
// constructors refuse the option for a Middleware of another dialect, and
// with WithTenant. Default is none: a poison message is terminated.
func WithDeadLetter(ob *outbox.Outbox, subject string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("WithDeadLetter: nil outbox")
		}
		if subject == "" {
			return errors.New("WithDeadLetter: empty subject")
		}
		c.deadLetter, c.deadSubject = ob, subject
		return nil
	})
}
