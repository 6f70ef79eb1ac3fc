package cdkpubsub

import (
	"errors"
	"fmt"
	"time"

	"gocloud.dev/pubsub"

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

// Defaults and limits of the options of this package's own.
const (
	// DefaultRetryDelay and DefaultMaxRetryDelay are WithRetryDelay's
	// defaults. gocloud.dev/pubsub reports no delivery count, so every
	// requeue is a first attempt for the backoff: about DefaultRetryDelay.
	DefaultRetryDelay    = time.Second
	DefaultMaxRetryDelay = 10 * time.Second
	// MaxRetryDelay is the longest maximum WithRetryDelay accepts: a worker
	// holds the message, unacknowledged, while it waits, so the wait must
	// stay well inside the subscription's ack deadline.
	MaxRetryDelay = time.Minute
	// DefaultBatchSize is WithBatchSize's default.
	DefaultBatchSize = 100
	// DefaultBatchWait is WithBatchWait's default.
	DefaultBatchWait = 5 * time.Millisecond
	// MaxBatchWait is the longest WithBatchWait accepts.
	MaxBatchWait = time.Second
)

type config struct {
	adapter.Config[*pubsub.Message]
	batch      bool
	batchSize  int // 0 until WithBatchSize
	batchWait  time.Duration
	deadLetter *outbox.Outbox
	deadKind   string
}

// newConfig applies opts for constructor who, and checks the result for mw.
func newConfig(who string, batch bool, mw *idempotent.Middleware, opts []Option) (config, error) {
	c := config{Config: adapter.NewConfig(transport), batch: batch, batchWait: DefaultBatchWait}
	if err := c.SetRetryDelay(DefaultRetryDelay, DefaultMaxRetryDelay); err != nil {
		panic(err) // the defaults are valid
	}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("cdkpubsub: %s: nil option", who)
		}
		if err := o.apply(&c); err != nil {
			return c, fmt.Errorf("cdkpubsub: %s: %w", who, err)
		}
	}
	// Check's errors name the adapter ("cdkpubsub: …") already.
	if err := c.Check(mw); err != nil {
		return c, err
	}
	if c.batchSize == 0 {
		c.batchSize = DefaultBatchSize
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
// WithDeadLetter cannot be combined with it: the dead-letter outbox is one
// database's.
func WithTenant(ts *idempotent.Tenants, tenant func(m *pubsub.Message) (string, error)) Option {
	return optionFunc(func(c *config) error { return c.SetTenant(ts, tenant) })
}

// WithKey sets how the key of each message is read: Metadata (the default,
// Metadata(DefaultKeyMetadata)), BodyField, Prefixed, or a KeyFunc of your
// own. Never LoggableID: most drivers assign it on receipt. Default is
// Metadata(DefaultKeyMetadata).
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return c.SetKey(k) })
}

// WithEventTime makes the Consumer read each message's event time with at
// instead of the adapter.EventTimeHeader metadata key: a field of the body,
// or a metadata key of another name ([TimeMetadata]). The time must be set
// by the producer and be the same on every delivery. An error from at, or
// the zero time, makes the message poison. It counts as a producer's event
// time, so a partitioned Middleware accepts it. Default is the
// adapter.EventTimeHeader metadata key.
//
// There is no WithTransportEventTime: gocloud.dev/pubsub has no time common
// to its drivers (a publish time, where a driver has one, is reachable only
// through Message.As, and is new on every re-send anyway).
func WithEventTime(at EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return c.SetEventTime(at) })
}

// WithoutEventTime makes the Consumer read no event time: each message is
// claimed by its key alone, with no retention fence, even when it carries
// the adapter.EventTimeHeader metadata key. A Middleware in partitioned
// mode needs event times, so the constructors refuse this option for one
// (an error matching adapter.ErrNoProducerEventTime). Default is the
// adapter.EventTimeHeader metadata key.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetNoEventTime() })
}

// WithObserver sets the Observer told of every settlement — one
// adapter.Event of type EventApplied, EventDuplicate, EventRequeued,
// EventDeadLettered or EventReleased per delivery, with Detail the
// *pubsub.Message and Source its LoggableID (Attempt is zero:
// gocloud.dev/pubsub counts no deliveries) — and, in addition, of every dead letter that could not
// be written (EventSettleFailed, the message then requeued). Observe runs
// on the worker's goroutine, after the message was acked or nacked; it must
// be safe for concurrent use and return quickly. Consumer.Stats counts the
// same events. Default is none.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return c.SetObserver(o) })
}

// WithTracer traces the messages with t (package oteltrace gives one):
// each message's transaction, or each batch's, is a span that continues the
// trace of the producer whose context the messages carry in their
// metadata. Default is none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return c.SetTracer(t) })
}

// WithRetryDelay sets how long a message whose handler failed with an
// error that is not poison is held before it is handed back: the worker
// waits the delay adapter.Rule.Settle gives (idempotent.RetryPolicy.Backoff;
// gocloud.dev/pubsub has no delivery count, so always the first attempt's,
// initial drawn from its upper half — or, for a message dated in the
// future, until the clock catches up, at most max) and then Nacks it where
// the driver can (Message.Nackable); elsewhere it leaves the message
// unacknowledged, and the service delivers it again at its ack deadline.
// The worker is busy while it holds a message, and the message's ack
// deadline runs meanwhile: keep max well inside it. It must hold 0 <
// initial <= max <= MaxRetryDelay. Default is DefaultRetryDelay up to
// DefaultMaxRetryDelay.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error {
		if max > MaxRetryDelay {
			return fmt.Errorf("WithRetryDelay: max %v is longer than %v, the longest a worker holds a message", max, MaxRetryDelay)
		}
		return c.SetRetryDelay(initial, max)
	})
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) a message's event time may be and the message be
// requeued until the clock catches up; a message dated further ahead is
// poison. Some drivers deliver nothing behind a nacked message until it is
// acked (Pub/Sub with ordering keys, an SQS FIFO message group, Kafka), so
// the default is short: the Middleware's clock-skew margin
// (idempotent.WithClockSkew). On a driver where other messages pass a
// nacked one, adapter.DefaultFutureBound lets a message dated up to an
// hour ahead wait instead of being dead-lettered. It must be positive.
// Default is the clock-skew margin.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetFutureBound(d) })
}

// WithWorkers sets how many goroutines receive and process messages at
// once, each with (through the Middleware) its own database connection:
// size the pool for it. It must be 1 to adapter.MaxWorkers. Default is
// adapter.DefaultWorkers.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return c.SetWorkers(n) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends,
// for in-flight messages to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the messages are delivered
// again, to be applied then. It must be positive. Default is
// adapter.DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetShutdownTimeout(d) })
}

// WithPoison marks more of a handler's errors as poison: an error for
// which isPoison returns true dead-letters the message instead of
// requeueing it. Errors matching adapter.ErrPoison (adapter.Poison,
// adapter.ErrUndecodable) are poison without it. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return c.SetPoison(isPoison) })
}

// WithBatchSize sets the most messages a worker of a batch Consumer
// (NewBatchConsumer) collects and hands its BatchHandler at once, in one
// transaction. A worker waits for the first message as long as it takes,
// then takes what else arrives within the batch wait (WithBatchWait), so a
// quiet subscription is not held up filling batches. It must be 1 to
// idempotent.MaxBatchSize, and is refused by NewConsumer. Default is
// DefaultBatchSize.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if !c.batch {
			return errors.New("WithBatchSize: for NewBatchConsumer only")
		}
		if n < 1 || n > idempotent.MaxBatchSize {
			return fmt.Errorf("WithBatchSize: %d, want 1 to %d", n, idempotent.MaxBatchSize)
		}
		c.batchSize = n
		return nil
	})
}

// WithBatchWait sets how long a worker of a batch Consumer waits, after a
// batch's first message, for each further one before it hands over what it
// has. Messages the subscription has already fetched come at once; the
// wait matters only when the subscription runs dry. It must be 0 to
// MaxBatchWait, and is refused by NewConsumer. Default is
// DefaultBatchWait.
func WithBatchWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if !c.batch {
			return errors.New("WithBatchWait: for NewBatchConsumer only")
		}
		if d < 0 || d > MaxBatchWait {
			return fmt.Errorf("WithBatchWait: %v, want 0 to %v", d, MaxBatchWait)
		}
		c.batchWait = d
		return nil
	})
}

// WithDeadLetter dead-letters poison messages through ob: each becomes one
// outbox row of the given kind — its body, metadata and why it was poison
// (a DeadLetter, as JSON), with its event time (outbox.WithEventTime) where
// it had one — committed before the message is acked, under an idempotency
// key derived from the message's key (or, for a message whose key cannot
// be read, from its body and metadata), so a poison message delivered
// again makes no second row. Register DeadLetterSender(topic) for kind on
// an outbox.Relay to publish the rows to a dead-letter topic. ob must be on
// the Middleware's database, which must be Postgres (the outbox is Postgres
// only: NewConsumer refuses the option for another dialect). A row that cannot be written (the database is
// down) leaves the message to be delivered again (EventRequeued). Without
// this option a poison message is acked and dropped, reported as
// adapter.EventDeadLettered. Default is none.
func WithDeadLetter(ob *outbox.Outbox, kind string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("WithDeadLetter: nil outbox")
		}
		if err := outbox.CheckKind(kind); err != nil {
			return fmt.Errorf("WithDeadLetter: %w", err)
		}
		c.deadLetter, c.deadKind = ob, kind
		return nil
	})
}
