package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// An Option configures a Consumer. Options are checked by NewConsumer and
// NewBatchConsumer: a bad value is an error from the constructor, never a
// surprise at the first delivery.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// Defaults and limits of the options.
const (
	// DefaultRetryDelay and DefaultMaxRetryDelay are WithRetryDelay's
	// defaults: a requeued delivery is held about a second on its first
	// failure, doubling up to ten seconds on a quorum queue, which counts
	// deliveries.
	DefaultRetryDelay    = time.Second
	DefaultMaxRetryDelay = 10 * time.Second
	// MaxRetryDelay is the longest maximum WithRetryDelay accepts: a worker
	// holds the delivery (and a prefetch slot) while it waits.
	MaxRetryDelay = time.Minute
	// DefaultBatchSize is WithBatchSize's default.
	DefaultBatchSize = 100
	// MaxPrefetch is the largest prefetch count AMQP allows.
	MaxPrefetch = 65535
)

type config struct {
	adapter.Config[*amqp.Delivery]
	prefetch        int // 0: the default
	batchSize       int // 0: not set
	tagPrefix       string
	deliveryContext func(context.Context, *amqp.Delivery) context.Context
	deadLetter      *outbox.Outbox // nil until WithDeadLetter
	deadExchange    string
	deadKey         string
}

func defaultConfig() config {
	c := config{Config: adapter.NewConfig(transport), tagPrefix: "idempotent"}
	if err := c.SetRetryDelay(DefaultRetryDelay, DefaultMaxRetryDelay); err != nil {
		panic(err) // the defaults are valid
	}
	return c
}

// WithKey sets the function that reads each delivery's message key.
// Default is [MessageID], the AMQP message_id property.
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return c.SetKey(k) })
}

// WithTenant routes each delivery to its tenant's Middleware in ts, for a
// consumer whose tenants each have a database of their own: tenant names
// the delivery's tenant (from a header or the body). NewConsumer and
// NewBatchConsumer are then given a nil Middleware. A batch is split by
// tenant, each tenant's part claimed and committed in a transaction of its
// own; a tenant whose database is down has its deliveries requeued while
// the others are acked; a delivery whose tenant cannot be read is poison.
// See adapter.Config.SetTenant. Default: no tenants.
func WithTenant(ts *idempotent.Tenants, tenant func(d *amqp.Delivery) (string, error)) Option {
	return optionFunc(func(c *config) error { return c.SetTenant(ts, tenant) })
}

// WithEventTime reads each delivery's event time with f, a function over
// the delivery (a header of the producer's own, see [TimeHeader], or a
// body field), instead of the adapter.EventTimeHeader header. f counts as
// a producer's event time: it is accepted in partitioned mode. A delivery
// for which f fails or returns the zero time is poison. Default is the
// header.
func WithEventTime(f EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return c.SetEventTime(f) })
}

// WithTransportEventTime reads each delivery's event time from the AMQP
// timestamp property (amqp091.Publishing.Timestamp, whole seconds) instead
// of the adapter.EventTimeHeader header. That is a transport time: a
// producer's re-send (an application retry, a relay resending after a lost
// confirm) stamps it anew, and so does a broker plugin that stamps messages
// on arrival. A re-send then gets a new event time — after midnight a new
// day — and the retention fence judges it by that time, not the event's.
// Because a re-send would land in another day's partition, where its first
// claim cannot be seen, and apply again, the option is refused for a
// Middleware in partitioned mode (an error matching
// adapter.ErrNoProducerEventTime). A delivery without a timestamp is poison
// (adapter.ErrNoEventTime). Default is the header.
func WithTransportEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetTransportEventTime() })
}

// WithoutEventTime reads no event time: the retention fence cannot apply to
// the deliveries. It is refused for a Middleware in partitioned mode (an
// error matching adapter.ErrNoProducerEventTime). Default is the
// adapter.EventTimeHeader header.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetNoEventTime() })
}

// WithObserver sets the Observer told of every delivery's settlement, on
// the worker's goroutine, with the delivery (*amqp091.Delivery) in
// Event.Detail: exactly one of adapter.EventApplied, EventDuplicate,
// EventRequeued, EventDeadLettered and EventReleased per delivery, after
// the broker was told, and adapter.EventSettleFailed in addition when the
// ack, nack or reject could not be sent. Consumer.Stats counts the same
// events. Default is none.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return c.SetObserver(o) })
}

// WithTracer traces the deliveries with t (package oteltrace gives one):
// each delivery's transaction, or each batch's, is a span that continues
// the trace of the producer whose context the deliveries carry in their
// headers. Default is none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return c.SetTracer(t) })
}

// WithRetryDelay sets how long a delivery to be requeued is held before it
// is nacked with requeue, so that a failing message does not spin between
// the broker and the consumer: initial after its first failure, doubling
// (jittered) for each further attempt up to max, as
// idempotent.RetryPolicy.Backoff computes it. The attempt is the quorum
// queue's x-delivery-count header plus one; a classic queue counts no
// deliveries, so its every requeue waits about initial. A message dated
// ahead of the clock is held at most max too, and requeued again each time
// it comes back until the clock has caught up. The wait is cut short when
// Run is shutting down. It needs 0 < initial <= max <= MaxRetryDelay.
// Default is DefaultRetryDelay up to DefaultMaxRetryDelay.
//
// The delay bounds the retry rate, not the number of retries: to
// dead-letter a message after N failed deliveries, use a quorum queue with
// the x-delivery-limit argument.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error {
		if max > MaxRetryDelay {
			return fmt.Errorf("WithRetryDelay: max %v is longer than %v, the longest a worker holds a delivery", max, MaxRetryDelay)
		}
		return c.SetRetryDelay(initial, max)
	})
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) an event time may be and be requeued until the clock
// catches up; further ahead is poison. Default is
// adapter.DefaultFutureBound.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetFutureBound(d) })
}

// WithWorkers sets how many deliveries (or batches) are processed at once,
// each by its own goroutine and, through the Middleware, its own database
// connection: size the pool for it. It must be 1 to adapter.MaxWorkers.
// Default is adapter.DefaultWorkers.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return c.SetWorkers(n) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends,
// for in-flight deliveries to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the deliveries are requeued,
// to be applied on redelivery. It must be positive. Default is
// adapter.DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetShutdownTimeout(d) })
}

// WithPoison sets a poison predicate: a handler error for which it returns
// true dead-letters the delivery instead of requeueing it, besides the
// errors the settle rule calls poison (adapter.ErrPoison and the
// Middleware's errors no redelivery can fix). Use it for another package's
// errors. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return c.SetPoison(isPoison) })
}

// WithPrefetch sets the channel's prefetch count (basic.qos): how many
// unacked deliveries the broker sends ahead. It must be at least the
// number of workers (and, for a batch consumer, the batch size), or
// workers would sit idle, and at most MaxPrefetch. Default is twice the
// workers (times the batch size, for a batch consumer), at most
// MaxPrefetch.
func WithPrefetch(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxPrefetch {
			return fmt.Errorf("WithPrefetch: %d, want 1 to %d", n, MaxPrefetch)
		}
		c.prefetch = n
		return nil
	})
}

// WithBatchSize sets the most deliveries a batch consumer (NewBatchConsumer)
// claims in one transaction, 1 to idempotent.MaxBatchSize. NewConsumer
// refuses it. Default is DefaultBatchSize.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > idempotent.MaxBatchSize {
			return fmt.Errorf("WithBatchSize: %d, want 1 to %d", n, idempotent.MaxBatchSize)
		}
		c.batchSize = n
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
			return fmt.Errorf("WithConsumerTag: %q, want 1 to 200 bytes", prefix)
		}
		c.tagPrefix = prefix
		return nil
	})
}

// WithDeliveryContext sets a function that derives each delivery's context
// from the delivery, before its transaction begins: the handler, the
// Middleware's Observer and the Consumer's get the context it returns. Use
// it to continue a producer's trace carried in the message's headers, with
// a propagator of your tracing library (otelmetrics.ContextFromHeaders for
// OpenTelemetry). f runs on the worker's goroutine and must return ctx or
// a context derived from it, so that the shutdown timeout still cancels
// the handler; a nil return keeps ctx. NewBatchConsumer refuses it: a
// batch has no one delivery to derive its context from. Default is none.
func WithDeliveryContext(f func(ctx context.Context, d *amqp.Delivery) context.Context) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("WithDeliveryContext: nil function")
		}
		c.deliveryContext = f
		return nil
	})
}

// WithDeadLetter dead-letters poison deliveries through ob to exchange with
// routingKey (the default exchange "" and a queue's name send to that
// queue), in place of rejecting them to the queue's dead-letter exchange:
// the Consumer writes an outbox row of kind DeadLetterKind holding the
// message (body, message id, content type, headers, where it came from),
// the error and the delivery count where the queue keeps one, with the
// event time it read (outbox.WithEventTime), in a transaction of the
// Middleware's, and acks the delivery once it committed; if the write
// fails, the delivery is requeued and dead-lettered on a later delivery. A
// relay with DeadLetterSender for that kind publishes it. Unlike the
// broker's dead-letter exchange, whose messages can only be seen by
// consuming them, the rows are what package deadletter and "idempotent
// dead-letters" list, show, replay (ReplaySender) and discard. The outbox
// is Postgres only: the constructors refuse the option for a Middleware of
// another dialect, and with WithTenant. Default is none: a poison delivery
// is rejected without requeue, to the queue's dead-letter exchange if it
// has one.
func WithDeadLetter(ob *outbox.Outbox, exchange, routingKey string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("WithDeadLetter: nil outbox")
		}
		if exchange == "" && routingKey == "" {
			return errors.New("WithDeadLetter: no exchange and no routing key (the default exchange needs the dead-letter queue's name as routing key)")
		}
		c.deadLetter, c.deadExchange, c.deadKey = ob, exchange, routingKey
		return nil
	})
}
