package mqtt

import (
	"errors"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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
	// DefaultBatchSize is WithBatchSize's default.
	DefaultBatchSize = 100
	// DefaultBatchWait is WithBatchWait's default.
	DefaultBatchWait = 5 * time.Millisecond
	// MaxBatchWait is the longest WithBatchWait accepts.
	MaxBatchWait = time.Second
)

type config struct {
	adapter.Config[*paho.Publish]
	batch     bool
	batchSize int // 0 until WithBatchSize
	batchWait time.Duration
}

// newConfig applies opts for constructor who, and checks the result for mw.
func newConfig(who string, batch bool, mw *idempotent.Middleware, opts []Option) (config, error) {
	c := config{Config: adapter.NewConfig(transport), batch: batch, batchWait: DefaultBatchWait}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("mqtt: %s: nil option", who)
		}
		if err := o.apply(&c); err != nil {
			return c, fmt.Errorf("mqtt: %s: %w", who, err)
		}
	}
	// Check's errors name the adapter ("mqtt: …") already.
	if err := c.Check(mw); err != nil {
		return c, err
	}
	if c.batchSize == 0 {
		c.batchSize = DefaultBatchSize
	}
	return c, nil
}

// WithKey sets how the key of each message is read: Property (the default,
// Property(DefaultKeyProperty)), BodyField, Prefixed, or a KeyFunc of your
// own. Never the packet identifier. Default is
// Property(DefaultKeyProperty).
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return c.SetKey(k) })
}

// WithEventTime makes the Consumer read each message's event time with at
// instead of the adapter.EventTimeHeader user property: a field of the
// payload, or a user property of another name ([TimeProperty]). The time
// must be set by the producer and be the same on every delivery. An error
// from at, or the zero time, makes the message poison. It counts as a
// producer's event time, so a partitioned Middleware accepts it. Default
// is the adapter.EventTimeHeader user property.
//
// There is no WithTransportEventTime: MQTT stamps no time on a message.
func WithEventTime(at EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return c.SetEventTime(at) })
}

// WithoutEventTime makes the Consumer read no event time: each message is
// claimed by its key alone, with no retention fence. A Middleware in
// partitioned mode needs event times, so the constructors refuse this
// option for one (an error matching adapter.ErrNoProducerEventTime).
// Default is the adapter.EventTimeHeader user property.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetNoEventTime() })
}

// WithObserver sets the Observer told of every settlement — one
// adapter.Event of type EventApplied, EventDuplicate, EventRequeued,
// EventDeadLettered or EventReleased per delivery, with Detail the
// *paho.Publish, Source its topic and Attempt the delivery's attempt in
// this process — and of every connection that failed or was lost
// (EventFetchError). Observe runs on the worker's goroutine; it must be
// safe for concurrent use and return quickly. Consumer.Stats counts the
// same events. Default is none.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return c.SetObserver(o) })
}

// WithTracer sets the Tracer (oteltrace.New gives one on OpenTelemetry)
// that records each transaction's span: a delivery's span continues the
// trace context the producer put in the message's user properties (the
// Sender does, for an outbox created WithTracer), a batch's span links to
// each message's. Default is none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return c.SetTracer(t) })
}

// WithRetryDelay sets how long a message whose handler failed with an error
// that is not poison waits before the worker runs it again. MQTT has no
// negative acknowledgement — a broker sends an unacknowledged message again
// only on the next connection of the session — so the worker holds the
// message, unacknowledged, and retries it itself, the delay doubling with
// jitter from initial to max with each attempt (idempotent.RetryPolicy.
// Backoff), or, for a message dated in the future, until the clock catches
// up. Meanwhile the acknowledgements of the messages behind it wait (they
// go back in order), and so, once the broker's in-flight window is full,
// does their delivery. It must hold 0 < initial <= max. Default is
// idempotent.DefaultRetryPolicy's.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetRetryDelay(initial, max) })
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) a message's event time may be and the message be
// retried until the clock catches up; a message dated further ahead is
// poison. A waiting message holds back the acknowledgements behind it, so
// the default is short: the Middleware's clock-skew margin
// (idempotent.WithClockSkew). It must be positive. Default is the
// clock-skew margin.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetFutureBound(d) })
}

// WithWorkers sets how many messages are processed at once, each with
// (through the Middleware) its own database connection: size the pool for
// it. It must be 1 to adapter.MaxWorkers. Default is
// adapter.DefaultWorkers.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return c.SetWorkers(n) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends,
// for in-flight messages to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the broker sends the
// messages again on the session's next connection, to be applied then. It
// must be positive. Default is adapter.DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetShutdownTimeout(d) })
}

// WithPoison marks more of a handler's errors as poison: an error for
// which isPoison returns true dead-letters the message instead of
// retrying it. Errors matching adapter.ErrPoison (adapter.Poison,
// adapter.ErrUndecodable) are poison without it. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return c.SetPoison(isPoison) })
}

// WithBatchSize sets the most messages a worker of a batch Consumer
// (NewBatchConsumer) collects and hands its BatchHandler at once, in one
// transaction. A worker waits for the first message as long as it takes,
// then takes what else arrives within the batch wait (WithBatchWait). It
// must be 1 to idempotent.MaxBatchSize, and is refused by NewConsumer.
// Default is DefaultBatchSize.
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
// has. It must be 0 to MaxBatchWait, and is refused by NewConsumer. Default
// is DefaultBatchWait.
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
