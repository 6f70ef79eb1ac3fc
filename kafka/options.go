package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/outbox"
)

// An Option configures a Consumer. Options are checked by NewConsumer and
// NewBatchConsumer: a bad value is an error from them, never a surprise at
// the first record.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// Limits on option values.
const (
	// MaxWorkers is the largest number of workers WithWorkers accepts.
	MaxWorkers = 1024
	// MaxRetryDelay is the longest retry delay WithRetryDelay accepts.
	MaxRetryDelay = time.Minute
	// MaxPollRecords is the most records WithMaxPollRecords accepts.
	MaxPollRecords = 100000
)

type config struct {
	workers         int
	maxPoll         int
	retryInitial    time.Duration
	retryMax        time.Duration
	shutdownTimeout time.Duration
	poison          []func(error) bool
	observer        Observer
	offsetsTable    string
	deadLetter      *outbox.Outbox
	deadTopic       string
	eventTime       eventTimeSource
	eventTimeFn     EventTimeFunc
	reset           ResetPosition
	adopt           bool
}

func defaultConfig() config {
	return config{
		workers:         4,
		maxPoll:         1000,
		retryInitial:    100 * time.Millisecond,
		retryMax:        5 * time.Second,
		shutdownTimeout: 30 * time.Second,
		offsetsTable:    DefaultOffsetsTable,
	}
}

// WithWorkers sets how many partitions are processed at once, each by its
// own goroutine (and its own database connection: size the pool for it).
// Records of one partition are always applied one after another, in offset
// order. It must be 1 to MaxWorkers. Default is 4.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxWorkers {
			return fmt.Errorf("kafka: WithWorkers: %d workers, want 1 to %d", n, MaxWorkers)
		}
		c.workers = n
		return nil
	})
}

// WithMaxPollRecords bounds how many records one poll returns, over all
// partitions; a poll's records are finished before the group may rebalance,
// so this bounds how long a rebalance waits. In batch mode one poll's
// records of one partition form a batch, split at idempotent.MaxBatchSize.
// It must be 1 to MaxPollRecords. Default is 1000.
func WithMaxPollRecords(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxPollRecords {
			return fmt.Errorf("kafka: WithMaxPollRecords: %d, want 1 to %d", n, MaxPollRecords)
		}
		c.maxPoll = n
		return nil
	})
}

// WithRetryDelay sets the backoff of a record (or batch) that failed with an
// error that adapter.Rule.Settle requeues: Kafka keeps a partition's records
// in order, so the partition waits and tries the same record again — it
// never skips it. The waits are idempotent.RetryPolicy{InitialBackoff:
// initial, MaxBackoff: max}.Backoff(attempt), the rule's backoff. A record
// dated in the future, within the rule's bound, waits until the clock
// catches up, looking again at least every max. Retries go on until the
// record succeeds, turns out poison, or the partition is revoked or the
// Consumer stops (then nothing of it was written, and it is read again from
// the stored offset). The Middleware's own retries of serialization
// failures, deadlocks and lost connections (its idempotent.WithRetry
// policy) happen inside each attempt. Both must be positive, initial <= max
// <= MaxRetryDelay. Default is 100ms to 5s.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error {
		if initial <= 0 || max < initial || max > MaxRetryDelay {
			return fmt.Errorf("kafka: WithRetryDelay: %v to %v, want 0 < initial <= max <= %v", initial, max, MaxRetryDelay)
		}
		c.retryInitial, c.retryMax = initial, max
		return nil
	})
}

// WithShutdownTimeout bounds how long Run waits, after its context ends, for
// in-flight transactions to finish. When it runs out their contexts are
// cancelled: they roll back, and their records are read again by the next
// owner from the stored offset. It must be positive. Default is 30 seconds.
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("kafka: WithShutdownTimeout: %v is not a positive duration", d)
		}
		c.shutdownTimeout = d
		return nil
	})
}

// WithPoison adds a poison predicate: a handler error for which it returns
// true dead-letters the record instead of retrying it. A record is poison if
// IsPoison or any added predicate says so, or else if adapter.Rule.Settle
// does (an invalid key, a record too old or too far in the future, a bad
// event-time header). Default is IsPoison alone.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error {
		if isPoison == nil {
			return errors.New("kafka: WithPoison: nil predicate")
		}
		c.poison = append(c.poison, isPoison)
		return nil
	})
}

// WithObserver sets the observer told of every record's outcome, retry,
// fence and rebalance. Default is none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return errors.New("kafka: WithObserver: nil observer")
		}
		c.observer = o
		return nil
	})
}

// WithOffsetsTable sets the offsets table, as "table" or "schema.table"
// (plain identifiers, quoted in every statement). Default is
// DefaultOffsetsTable ("kafka_offsets").
func WithOffsetsTable(name string) Option {
	return optionFunc(func(c *config) error {
		c.offsetsTable = name
		return nil
	})
}

// WithDeadLetter sends poison records to the Kafka topic deadTopic through
// ob: each poison record becomes one outbox row of kind DeadLetterKind,
// written in the transaction that advances the record's offset, so the row
// exists exactly once per poison record whatever crashes or rebalances
// happen. A Relay with DeadLetterSender produces the rows to Kafka. Without
// this option a poison record is dropped: its offset advances, nothing else
// is written, and the Observer is told (EventDropped). Default is none.
func WithDeadLetter(ob *outbox.Outbox, deadTopic string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("kafka: WithDeadLetter: nil outbox")
		}
		if deadTopic == "" || len(deadTopic) > 249 {
			return fmt.Errorf("kafka: WithDeadLetter: topic %q, want 1 to 249 bytes", deadTopic)
		}
		c.deadLetter, c.deadTopic = ob, deadTopic
		return nil
	})
}

// ResetPosition says where a partition with no stored offset starts.
type ResetPosition int

const (
	// ResetEarliest starts at the log start: every record the log still
	// holds is applied (those applied before are duplicates by their
	// claims). It is the default.
	ResetEarliest ResetPosition = iota
	// ResetLatest starts at the log end: the records already in the
	// partition are never applied.
	ResetLatest
)

// String returns "earliest" or "latest".
func (p ResetPosition) String() string {
	switch p {
	case ResetEarliest:
		return "earliest"
	case ResetLatest:
		return "latest"
	}
	return fmt.Sprintf("ResetPosition(%d)", int(p))
}

// WithResetPosition sets where a partition with no stored offset in the
// database starts: ResetEarliest or ResetLatest. It applies only where the
// offsets table has no row for the partition — a new consumer, a new
// partition, or a database restored from before the partition's first
// record — never to a partition whose row exists: that one always starts at
// its stored offset. Kafka's own committed offset is never used unless
// WithAdoptGroupOffsets. Default is ResetEarliest, so that a restore that
// lost the row applies again every record the log still holds.
func WithResetPosition(p ResetPosition) Option {
	return optionFunc(func(c *config) error {
		if p != ResetEarliest && p != ResetLatest {
			return fmt.Errorf("kafka: WithResetPosition: %v, want ResetEarliest or ResetLatest", p)
		}
		c.reset = p
		return nil
	})
}

// WithAdoptGroupOffsets makes a partition with no stored offset in the
// database start at the consumer group's offset committed to Kafka, where
// the group has one (else at the WithResetPosition position). It is for
// one thing only: moving an existing consumer group, which committed its
// offsets to Kafka, onto this package without applying its topic again from
// the start. Remove it once every partition has a stored offset (the first
// record of each sets it): left on, a database restored from before a
// partition's first record resumes that partition at Kafka's committed
// offset — which the restore did not roll back — and the records between
// are never applied. Default is off: Kafka's committed offset is written
// for lag tools only and never read.
func WithAdoptGroupOffsets() Option {
	return optionFunc(func(c *config) error {
		c.adopt = true
		return nil
	})
}

// EventTimeFunc returns the event time of a record: the time its producer
// gave the event, the same on every re-send. The zero time means the record
// has none. An error makes the record poison when it matches
// idempotent.ErrInvalidEventTime or ErrPoison (see adapter.Rule.Settle),
// and retries it otherwise.
type EventTimeFunc func(r *kgo.Record) (time.Time, error)

// eventTimeSource is where a Consumer takes each record's event time from.
type eventTimeSource int

const (
	eventTimeHeader    eventTimeSource = iota // adapter.EventTimeHeader, the default
	eventTimeFunc                             // WithEventTime
	eventTimeTransport                        // WithTransportEventTime
	eventTimeNone                             // WithoutEventTime
)

// WithEventTime makes the Consumer take each record's event time from fn,
// a function over the record (its value, say), instead of the
// adapter.EventTimeHeader header. It is a producer's time source: a
// Middleware whose claim table is partitioned by event day accepts it. The
// last of WithEventTime, WithTransportEventTime and WithoutEventTime
// given wins. Default is the header.
func WithEventTime(fn EventTimeFunc) Option {
	return optionFunc(func(c *config) error {
		if fn == nil {
			return errors.New("kafka: WithEventTime: nil function")
		}
		c.eventTime, c.eventTimeFn = eventTimeFunc, fn
		return nil
	})
}

// WithTransportEventTime makes the Consumer take each record's Kafka
// timestamp as its event time, instead of the adapter.EventTimeHeader
// header. Use it only where every producer sets the record timestamp
// (CreateTime) to the event's time and every re-send copies it: a re-send
// with a new timestamp — an application retry, an outbox relay resending
// after a lost acknowledgement, a replay from a dead-letter topic, a topic
// with LogAppendTime — is then a new event time. On a claim table
// partitioned by event day a re-send after UTC midnight gets a new day, whose
// partition cannot see the first claim, and is applied a second time; on a
// plain table the retention fence reads a re-send's age from its new
// timestamp, so a replay of a message whose claim cleanup already deleted is
// applied again. A Middleware partitioned by event day is therefore refused
// with it (adapter.ErrNoProducerEventTime), as by every adapter. Default is
// off: the event time comes from the header.
func WithTransportEventTime() Option {
	return optionFunc(func(c *config) error {
		c.eventTime, c.eventTimeFn = eventTimeTransport, nil
		return nil
	})
}

// WithoutEventTime stops the Consumer from reading any event time: every
// record is claimed without one, so the Middleware's retention fence never
// refuses it (a record whose claim cleanup already deleted is applied
// again). A Middleware whose claim table is partitioned by event day needs
// every record's event time: NewConsumer and NewBatchConsumer refuse this
// option with it (adapter.ErrNoProducerEventTime). Default is off: the
// event time comes from the adapter.EventTimeHeader header.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error {
		c.eventTime, c.eventTimeFn = eventTimeNone, nil
		return nil
	})
}
