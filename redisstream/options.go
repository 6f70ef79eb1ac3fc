package redisstream

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// An Option configures a Consumer. Options are checked by NewConsumer and
// NewBatchConsumer: a bad value is an error from the constructor, never a
// surprise at the first entry.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// MaxBatchSize is the most entries one read takes (WithBatchSize): it is
// idempotent.MaxBatchSize, the most one claim transaction takes.
const MaxBatchSize = idempotent.MaxBatchSize

// Defaults of the options of this package's own.
const (
	// DefaultBatchSize is the most entries a batch Consumer reads and hands
	// its handler at once (WithBatchSize).
	DefaultBatchSize = 100
	// DefaultClaimIdle is how long an entry stays pending, unacknowledged
	// and untouched by its consumer, before another consumer of the group
	// re-claims it (WithClaimIdle).
	DefaultClaimIdle = time.Minute
	// DefaultBlock is how long one XREADGROUP waits for new entries
	// (WithBlock).
	DefaultBlock = time.Second
	// readCount is how many entries a per-message Consumer asks for in one
	// XREADGROUP.
	readCount = 16
)

type config struct {
	adapter.Config[*Delivery]
	batchSize     int // 0 until WithBatchSize
	name          string
	claimIdle     time.Duration
	block         time.Duration
	maxDeliveries int64
	deadLetter    *outbox.Outbox
	deadStream    string
}

// newConfig applies opts for constructor who, and checks the result for mw.
func newConfig(who string, mw *idempotent.Middleware, opts []Option) (config, error) {
	c := config{Config: adapter.NewConfig(transport), claimIdle: DefaultClaimIdle, block: DefaultBlock}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("redisstream: %s: nil option", who)
		}
		if err := o.apply(&c); err != nil {
			return c, fmt.Errorf("redisstream: %s: %w", who, err)
		}
	}
	// Check's errors name the adapter ("redisstream: …") already.
	if err := c.Check(mw); err != nil {
		return c, err
	}
	if c.name == "" {
		c.name = defaultName()
	}
	return c, nil
}

// defaultName is a consumer name no other process has: the host name and
// random hex digits.
func defaultName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// WithTenant routes each entry to its tenant's Middleware in ts, for a
// consumer whose tenants each have a database of their own: tenant names
// the entry's tenant (from a header or the body). The constructors are
// then given a nil Middleware. A batch is split by tenant, each tenant's
// part claimed and committed in a transaction of its own; a tenant whose
// database is down has its entrys redelivered while the others are
// acked; a entry whose tenant cannot be read is poison. See
// adapter.Config.SetTenant. Default: no tenants.
// WithDeadLetter cannot be combined with it: the dead-letter outbox is one
// database's.
func WithTenant(ts *idempotent.Tenants, tenant func(d *Delivery) (string, error)) Option {
	return optionFunc(func(c *config) error { return c.SetTenant(ts, tenant) })
}

// WithKey sets how the key of each entry is read: Field, BodyField,
// Prefixed, or a KeyFunc of your own. Default is Field(DefaultKeyField).
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return c.SetKey(k) })
}

// WithEventTime makes the Consumer read each entry's event time with at
// instead of the default, the [adapter.EventTimeHeader] field: a field of
// the payload, or a field of another name ([TimeField]). The time must be
// set by the producer and be the same on every copy of the message: never
// the entry id's time, which a second XADD changes (see
// WithTransportEventTime). An error from at, or the zero time, makes the
// delivery poison. It counts as a producer's event time, so a partitioned
// Middleware accepts it. Default is the adapter.EventTimeHeader field.
func WithEventTime(at EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return c.SetEventTime(at) })
}

// WithTransportEventTime makes the Consumer take each entry's event time
// from its id: the millisecond Redis added it ([Delivery.Time]). That is
// not the producer's time: a message added again — a producer retrying
// an XADD whose reply it lost, an outbox relay sending again, a replay
// from a dead-letter stream — gets a new id, so on a day-partitioned
// claim table a re-send after UTC midnight would land in another day's
// partition, where its first claim cannot be seen, and be applied again;
// and the retention fence cannot recognise an old message added again.
// Use it only where every message is added once; a Middleware partitioned
// by event day refuses it (adapter.ErrNoProducerEventTime). Default is
// the adapter.EventTimeHeader field.
func WithTransportEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetTransportEventTime() })
}

// WithoutEventTime makes the Consumer read no event time: each entry is
// claimed by its key alone, with no retention fence, even when it carries
// the adapter.EventTimeHeader field. A Middleware in partitioned mode
// needs event times, so the constructors refuse this option for one (an
// error matching adapter.ErrNoProducerEventTime). Default is the
// adapter.EventTimeHeader field.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return c.SetNoEventTime() })
}

// WithObserver sets the Observer told of every settlement — one
// adapter.Event of type EventApplied, EventDuplicate, EventRequeued,
// EventDeadLettered or EventReleased per delivery, with Detail the
// *Delivery (a [Dropped] for a dead letter without WithDeadLetter) — and,
// in addition, of every XACK that failed (EventSettleFailed) and every
// failed read that Run retries (EventFetchError). Observe runs on the
// worker's goroutine, after Redis was told; it must be safe for concurrent
// use and return quickly. Consumer.Stats counts the same events. Default
// is none.
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

// WithRetryDelay sets the delay before an entry whose handler failed with
// an error that is not poison is read again: adapter.Rule.Settle's delay,
// idempotent.RetryPolicy.Backoff of the entry's delivery count — initial
// after the first delivery, doubling with each further one up to max,
// each drawn at random from the upper half of its value. (An entry dated
// in the future waits at least until the clock catches up.) The entry
// stays pending to the Consumer meanwhile. It must hold
// 0 < initial <= max. Default is idempotent.DefaultRetryPolicy's backoff.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetRetryDelay(initial, max) })
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) an entry's event time may be and the entry be
// requeued until the clock catches up; an entry dated further ahead is
// dead-lettered. It must be positive. Default is adapter.DefaultFutureBound.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetFutureBound(d) })
}

// WithWorkers sets how many entries (batches, for a batch Consumer) are
// handled at once, each in its own transaction on its own database
// connection: size the pool for it. It must be 1 to adapter.MaxWorkers.
// Default is adapter.DefaultWorkers.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return c.SetWorkers(n) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends,
// for in-flight entries to finish. When it runs out, their contexts are
// cancelled: their transactions roll back and the entries stay pending,
// to be re-claimed and applied then. It must be positive. Default is
// adapter.DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return c.SetShutdownTimeout(d) })
}

// WithPoison marks more of a handler's errors as poison: an error for
// which isPoison returns true dead-letters the entry instead of requeueing
// it. Errors matching adapter.ErrPoison (adapter.Poison,
// adapter.ErrUndecodable) are poison without it. Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return c.SetPoison(isPoison) })
}

// WithBatchSize sets the most entries a batch Consumer (NewBatchConsumer)
// reads with one XREADGROUP and hands its BatchHandler at once, in one
// transaction. It must be 1 to MaxBatchSize, and is refused by
// NewConsumer. Default is DefaultBatchSize.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxBatchSize {
			return fmt.Errorf("WithBatchSize: %d, want 1 to %d", n, MaxBatchSize)
		}
		c.batchSize = n
		return nil
	})
}

// WithConsumerName sets the Consumer's name in the consumer group. Every
// process (every Run) needs a name of its own: two Runs of one name would
// share one pending list. A process restarted under its old name finds
// what it left pending re-claimed after the claim idle bound, like any
// other. It must be 1 to 256 bytes. Default is the host name and 12
// random hex digits, new for every Consumer.
func WithConsumerName(name string) Option {
	return optionFunc(func(c *config) error {
		if name == "" || len(name) > 256 {
			return fmt.Errorf("WithConsumerName: %q, want 1 to 256 bytes", name)
		}
		c.name = name
		return nil
	})
}

// WithClaimIdle sets how long an entry of the group stays pending without
// its consumer touching it before this Consumer re-claims it with
// XAUTOCLAIM: the time after which an entry a dead consumer read (or
// requeued, or left pending at shutdown) is delivered again. A running
// Consumer touches what it holds (XCLAIM … JUSTID) every third of it,
// in-flight and requeued entries alike, so a live consumer's entries are
// not taken from it however long they wait. A re-claim counts as a
// delivery. It must be 10ms to one day. Default is DefaultClaimIdle.
func WithClaimIdle(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 10*time.Millisecond || d > 24*time.Hour {
			return fmt.Errorf("WithClaimIdle: %v, want 10ms to 24h", d)
		}
		c.claimIdle = d
		return nil
	})
}

// WithBlock sets how long one XREADGROUP waits for new entries. It also
// bounds how long a shutdown waits for the read in progress; entries that
// read returns then are left pending (EventReleased). It must be 1ms to one
// minute. Default is DefaultBlock.
func WithBlock(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("WithBlock: %v, want 1ms to 1m", d)
		}
		c.block = d
		return nil
	})
}

// WithMaxDeliveries bounds how many times the group delivers an entry: an
// entry requeued on its n-th delivery, or delivered more than n times
// (re-claimed again and again from consumers that crashed on it), is
// dead-lettered with an error matching ErrMaxDeliveries — to the stream of
// WithDeadLetter, or, without it, acknowledged and dropped. It must be 1
// or more. Default is no bound.
func WithMaxDeliveries(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithMaxDeliveries: %d, want 1 or more", n)
		}
		c.maxDeliveries = int64(n)
		return nil
	})
}

// WithDeadLetter sends poison entries to the stream deadStream through ob:
// the Consumer writes an outbox row of kind DeadLetterKind holding the
// entry and the error, with the entry's event time (outbox.WithEventTime),
// in a transaction of the Middleware's, and acknowledges the entry once it
// committed; a relay with DeadLetterSender for that kind adds it to
// deadStream. The outbox is Postgres only: NewConsumer refuses the option
// for a Middleware of another dialect. Without it a poison entry is
// acknowledged and dropped (the event's Detail is a [Dropped]). Default is
// none.
func WithDeadLetter(ob *outbox.Outbox, deadStream string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("WithDeadLetter: nil outbox")
		}
		if deadStream == "" {
			return errors.New("WithDeadLetter: empty stream name")
		}
		c.deadLetter, c.deadStream = ob, deadStream
		return nil
	})
}
