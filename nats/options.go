package nats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent"
)

// An Option configures a Consumer. Options are checked by NewConsumer and
// NewBatchConsumer: a bad value is an error from the constructor, never a
// surprise at the first message.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// Limits on option values.
const (
	// MaxWorkers is the largest number of workers WithWorkers accepts.
	MaxWorkers = 1024
	// MaxFetch is the most messages one pull request asks for
	// (WithFetchSize, and the batch size of NewBatchConsumer). It is
	// idempotent.MaxBatchSize, the most one claim transaction takes.
	MaxFetch = idempotent.MaxBatchSize
	// MaxNakDelay is the longest redelivery delay WithNakDelay accepts.
	MaxNakDelay = time.Hour
)

type config struct {
	workers         int
	fetchSize       int // 0: 1 per worker in batch mode, 8 otherwise
	fetchWait       time.Duration
	backoff         idempotent.RetryPolicy // the settle rule's requeue delays
	shutdownTimeout time.Duration
	poison          []func(error) bool
	onSettle        func(context.Context, Settlement)
	onFetchError    func(error)
}

func defaultConfig() config {
	return config{
		workers:         4,
		fetchWait:       time.Second,
		backoff:         nakBackoff(time.Second, time.Minute),
		shutdownTimeout: 30 * time.Second,
	}
}

// WithWorkers sets how many goroutines pull and process messages at once,
// each with its own pull requests and (through the middleware) its own
// database connection: size the pool for it. It must be 1 to MaxWorkers.
// Default is 4.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxWorkers {
			return fmt.Errorf("nats: WithWorkers: %d workers, want 1 to %d", n, MaxWorkers)
		}
		c.workers = n
		return nil
	})
}

// WithFetchSize sets how many messages a worker of a per-message Consumer
// (NewConsumer) asks for in one pull request; it handles them one after the
// other, each in its own transaction, as they arrive. Messages wait in the
// worker while earlier ones are handled, so keep n times the handler's
// duration well under the consumer's AckWait. It must be 1 to MaxFetch, and
// is refused by NewBatchConsumer, whose batch size plays this part.
// Default is 8.
func WithFetchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxFetch {
			return fmt.Errorf("nats: WithFetchSize: %d, want 1 to %d", n, MaxFetch)
		}
		c.fetchSize = n
		return nil
	})
}

// WithFetchWait sets how long a pull request stays open waiting for
// messages. A batch consumer handles what arrived when it expires (or as
// soon as the batch is full); a shutdown waits for the open requests to
// expire, handing back (nak) what arrives meanwhile. It must be 1ms to one
// minute. Default is one second.
func WithFetchWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("nats: WithFetchWait: %v, want 1ms to 1m", d)
		}
		c.fetchWait = d
		return nil
	})
}

// WithNakDelay sets the redelivery delay of a message whose handler failed
// with an error that is not poison: the Consumer naks it with the delay
// adapter.Rule.Settle gives, idempotent.RetryPolicy.Backoff of a policy
// from initial to max — initial after the first delivery, doubling with
// each further delivery (the server's delivery count) up to max, each drawn
// at random from the upper half of its value. (A message dated in the
// future waits at least until the clock catches up.) The delay keeps a failing message
// from spinning between the server and the consumer; the number of
// deliveries is bounded by the consumer's MaxDeliver, after which the server
// stops redelivering it (and sends a MAX_DELIVERIES advisory). It must hold
// 0 <= initial <= max <= MaxNakDelay. Default is one second up to one minute.
func WithNakDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error {
		if initial < 0 || initial > max || max > MaxNakDelay {
			return fmt.Errorf("nats: WithNakDelay(%v, %v): want 0 <= initial <= max <= %v", initial, max, MaxNakDelay)
		}
		c.backoff = nakBackoff(initial, max)
		return nil
	})
}

// nakBackoff is the policy of WithNakDelay(initial, max). MaxAttempts is
// set so that adapter.Rule does not take a policy of zero delays for its
// default.
func nakBackoff(initial, max time.Duration) idempotent.RetryPolicy {
	return idempotent.RetryPolicy{MaxAttempts: 1, InitialBackoff: initial, MaxBackoff: max}
}

// WithShutdownTimeout bounds how long Run waits, after its context ends, for
// in-flight messages to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the messages are redelivered,
// to be applied then. It must be positive. Default is 30 seconds.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("nats: WithShutdownTimeout: %v is not a positive duration", d)
		}
		c.shutdownTimeout = d
		return nil
	})
}

// WithPoison adds a poison predicate: a handler error that the settle rule
// (adapter.Rule) would requeue and for which it returns true terminates the
// message instead of naking it. Such an error is poison if IsPoison or any
// added predicate says so. Default is IsPoison alone.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error {
		if isPoison == nil {
			return errors.New("nats: WithPoison: nil predicate")
		}
		c.poison = append(c.poison, isPoison)
		return nil
	})
}

// WithOnSettle sets a function called after each message is settled (acked,
// naked, terminated or released), on the worker's goroutine: the place to
// report poison messages (Action Terminated, with the error), log and count.
// It must be safe for concurrent use and return quickly. Default is none.
func WithOnSettle(f func(ctx context.Context, s Settlement)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("nats: WithOnSettle: nil function")
		}
		c.onSettle = f
		return nil
	})
}

// WithOnFetchError sets a function told of each failed pull request that Run
// retries — the server is electing a leader, the connection is
// reconnecting — for logging. It must be safe for concurrent use. Default is
// none.
func WithOnFetchError(f func(err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("nats: WithOnFetchError: nil function")
		}
		c.onFetchError = f
		return nil
	})
}
