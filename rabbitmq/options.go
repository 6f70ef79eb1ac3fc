package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
)

// An Option configures a Consumer. Options are checked by NewConsumer: a bad
// value is an error from NewConsumer, never a surprise at the first delivery.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// Limits on option values.
const (
	// MaxWorkers is the largest number of workers WithWorkers accepts.
	MaxWorkers = 1024
	// MaxRequeueDelay is the longest delay WithRequeueDelay accepts. A
	// worker holds the delivery (and a prefetch slot) while it waits.
	MaxRequeueDelay = time.Minute
)

type config struct {
	workers         int
	prefetch        int // 0: twice the workers
	requeueDelay    time.Duration
	shutdownTimeout time.Duration
	poison          []func(error) bool
	onSettle        func(context.Context, Settlement)
	deliveryContext func(context.Context, *amqp.Delivery) context.Context
	tagPrefix       string
}

// backoff is the settle rule's backoff policy: the requeue delay.
func (c *config) backoff() idempotent.RetryPolicy {
	return idempotent.RetryPolicy{MaxAttempts: 1, InitialBackoff: c.requeueDelay, MaxBackoff: c.requeueDelay}
}

func defaultConfig() config {
	return config{
		workers:         4,
		requeueDelay:    time.Second,
		shutdownTimeout: 30 * time.Second,
		tagPrefix:       "idempotent",
	}
}

// WithWorkers sets how many deliveries are processed at once, each by its
// own goroutine (and, through the middleware, its own database connection:
// size the pool for it). It must be 1 to MaxWorkers. Default is 4.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxWorkers {
			return fmt.Errorf("rabbitmq: WithWorkers: %d workers, want 1 to %d", n, MaxWorkers)
		}
		c.workers = n
		return nil
	})
}

// WithPrefetch sets the channel's prefetch count (basic.qos): how many
// unacked deliveries the broker sends ahead. It must be at least the number
// of workers, or workers would sit idle, and at most 65535. Default is twice
// the number of workers.
func WithPrefetch(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > 65535 {
			return fmt.Errorf("rabbitmq: WithPrefetch: %d, want 1 to 65535", n)
		}
		c.prefetch = n
		return nil
	})
}

// WithRequeueDelay sets the requeue delay: the backoff of the settle rule
// (adapter.Rule.Backoff, jittered between d/2 and d) and the longest a
// worker holds a delivery, before it nacks it with requeue. The delay keeps
// a failing message from spinning between the broker and the consumer; it
// is cut short when Run is shutting down. A message dated ahead of the
// clock is held at most d too, and requeued again each time it comes back
// until the clock has caught up. 0 requeues at once. It must be 0 to
// MaxRequeueDelay. Default is one second.
//
// The delay bounds the retry rate, not the number of retries: to
// dead-letter a message after N failed deliveries, use a quorum queue with
// the x-delivery-limit argument.
func WithRequeueDelay(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 || d > MaxRequeueDelay {
			return fmt.Errorf("rabbitmq: WithRequeueDelay: %v, want 0 to %v", d, MaxRequeueDelay)
		}
		c.requeueDelay = d
		return nil
	})
}

// WithShutdownTimeout bounds how long Run waits, after its context ends, for
// in-flight deliveries to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the deliveries are requeued,
// to be applied on redelivery. It must be positive. Default is 30 seconds.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("rabbitmq: WithShutdownTimeout: %v is not a positive duration", d)
		}
		c.shutdownTimeout = d
		return nil
	})
}

// WithPoison adds a poison predicate: a handler error for which it returns
// true dead-letters the delivery instead of requeueing it. A delivery is
// poison if it matches ErrPoison, an added predicate says so, or the settle
// rule does (see IsPoison). Use it for another package's errors that no
// redelivery can fix. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error {
		if isPoison == nil {
			return errors.New("rabbitmq: WithPoison: nil predicate")
		}
		c.poison = append(c.poison, isPoison)
		return nil
	})
}

// WithOnSettle sets a function called after each delivery is settled (acked,
// requeued, dead-lettered or released), on the worker's goroutine, for
// logging and metrics. It must be safe for concurrent use and return
// quickly. Default is none.
func WithOnSettle(f func(ctx context.Context, s Settlement)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("rabbitmq: WithOnSettle: nil function")
		}
		c.onSettle = f
		return nil
	})
}

// WithConsumerTag sets the prefix of the consumer tags Run registers with
// the broker (each Run adds a random suffix, as tags must be unique per
// channel); it shows in the management UI. It must be 1 to 200 bytes.
// Default is "idempotent".
func WithConsumerTag(prefix string) Option {
	return optionFunc(func(c *config) error {
		if prefix == "" || len(prefix) > 200 {
			return fmt.Errorf("rabbitmq: WithConsumerTag: %q, want 1 to 200 bytes", prefix)
		}
		c.tagPrefix = prefix
		return nil
	})
}

// WithDeliveryContext sets a function that derives each delivery's context
// from the delivery, before the handler runs: the handler and the
// WithOnSettle function get the context it returns. Use it to continue a
// producer's trace carried in the message's headers, with a propagator of
// your tracing library (otelmetrics.ContextFromHeaders for OpenTelemetry).
// f runs on the worker's goroutine and must return ctx or a context derived
// from it, so that the shutdown timeout still cancels the handler; a nil
// return keeps ctx. Default is none.
func WithDeliveryContext(f func(ctx context.Context, d *amqp.Delivery) context.Context) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("rabbitmq: WithDeliveryContext: nil function")
		}
		c.deliveryContext = f
		return nil
	})
}
