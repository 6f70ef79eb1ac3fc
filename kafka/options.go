package kafka

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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

// Limits and defaults of option values.
const (
	// DefaultWorkers is how many partitions a Consumer applies at once
	// unless WithWorkers says otherwise.
	DefaultWorkers = 4
	// MaxPollRecords is the most records WithMaxPollRecords accepts.
	MaxPollRecords = 100000
	// DefaultPollRecords is how many records one poll returns at most
	// unless WithMaxPollRecords says otherwise.
	DefaultPollRecords = 1000
)

// transport is what a Kafka record carries, for the configuration every
// adapter shares: the key in the DefaultKeyHeader header by default, the
// event time in the adapter.EventTimeHeader header, the record timestamp
// as the transport's time (WithTransportEventTime only); and a partition
// is ordered: a record waiting for its next attempt holds back those
// behind it.
var transport = adapter.Transport[*kgo.Record]{
	Name:        "kafka",
	DefaultKey:  Header(DefaultKeyHeader),
	Header:      header,
	Time:        func(r *kgo.Record) time.Time { return r.Timestamp },
	TimeName:    "the Kafka record timestamp",
	Ordered:     true,
	System:      "kafka",
	Destination: func(r *kgo.Record) string { return r.Topic },
	// A record has no id of the transport's but its position.
	MessageID: func(r *kgo.Record) string {
		return strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
	},
	Payload: func(r *kgo.Record) []byte { return r.Value },
	// An ordered record parked to wait for its predecessor keeps every
	// header (ParkedRecord rebuilds it).
	Headers: func(r *kgo.Record) map[string]string {
		h := make(map[string]string, len(r.Headers))
		for _, rh := range r.Headers {
			h[rh.Key] = string(rh.Value)
		}
		return h
	},
}

type config struct {
	ac           adapter.Config[*kgo.Record]
	batch        bool // NewBatchConsumer's: WithBatchSize applies
	maxPoll      int
	batchSize    int
	offsetsTable string
	deadLetter   *outbox.Outbox
	deadTopic    string
	reset        ResetPosition
	adopt        bool
	tenantSet    *idempotent.Tenants // WithTenant's
	tenantOf     TenantFunc
}

func defaultConfig(batch bool) config {
	c := config{
		ac:           adapter.NewConfig(transport),
		batch:        batch,
		maxPoll:      DefaultPollRecords,
		batchSize:    idempotent.MaxBatchSize,
		offsetsTable: DefaultOffsetsTable,
	}
	_ = c.ac.SetWorkers(DefaultWorkers) // within bounds
	return c
}

// shared wraps an error of a setter of adapter.Config, which names the
// option, with the package's name.
func shared(err error) error {
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// WithKey sets how each record's message key is read: Header, BodyField,
// CloudEventsID, Prefixed or a KeyFunc of your own. A record whose key
// cannot be read is poison. Default is Header(DefaultKeyHeader).
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetKey(k)) })
}

// WithEventTime makes the Consumer read each record's event time with fn, a
// function over the record (its value, or a header of the producer's own:
// see TimeHeader), instead of the adapter.EventTimeHeader header. It is a
// producer's time: a Middleware whose claim table is partitioned by event
// day accepts it. A record for which fn fails or returns the zero time is
// poison. Only one of WithEventTime, WithTransportEventTime and
// WithoutEventTime may be given. Default is the header.
func WithEventTime(fn EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetEventTime(fn)) })
}

// WithTransportEventTime makes the Consumer take each record's Kafka
// timestamp as its event time, instead of the adapter.EventTimeHeader
// header. Use it only where every producer sets the record timestamp
// (CreateTime) to the event's time and every re-send copies it: a re-send
// with a new timestamp — an application retry, an outbox relay resending
// after a lost acknowledgement, a replay from a dead-letter topic, a topic
// with LogAppendTime — is then a new event time. On a claim table
// partitioned by event day a re-send after UTC midnight gets a new day,
// whose partition cannot see the first claim, and is applied a second time;
// on a plain table the retention fence reads a re-send's age from its new
// timestamp, so a replay of a message whose claim cleanup already deleted
// is applied again. A Middleware partitioned by event day is therefore
// refused with it (adapter.ErrNoProducerEventTime), as by every adapter.
// Default is off: the event time comes from the header.
func WithTransportEventTime() Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetTransportEventTime()) })
}

// WithoutEventTime stops the Consumer from reading any event time: every
// record is claimed without one, so the Middleware's retention fence never
// refuses it (a record whose claim cleanup already deleted is applied
// again). A Middleware whose claim table is partitioned by event day needs
// every record's event time: NewConsumer and NewBatchConsumer refuse this
// option with it (adapter.ErrNoProducerEventTime). Default is off: the
// event time comes from the adapter.EventTimeHeader header.
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetNoEventTime()) })
}

// WithObserver sets the observer told of every record's outcome, requeue,
// release, fence, stop and rebalance (see the package documentation for
// each event's Detail). Default is none; Consumer.Stats counts the events
// either way.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetObserver(o)) })
}

// WithTracer traces the records with t (package oteltrace gives one):
// each record's transaction, or each batch's, is a span that continues the
// trace of the producer whose context the records carry in their headers.
// Default is none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetTracer(t)) })
}

// WithRetryDelay sets the wait of a record (or batch) that failed with an
// error that adapter.Rule.Settle requeues: Kafka keeps a partition's
// records in order, so the partition waits and tries the same record again
// in place — it never skips it. The wait before attempt n+1 is the rule's:
// idempotent.RetryPolicy{InitialBackoff: initial, MaxBackoff:
// max}.Backoff(n), or, for a record dated in the future within the rule's
// bound, the time until the Middleware's clock reaches its event time (less
// the clock-skew margin) when that is longer. Retries go on until the
// record succeeds, turns out poison, or the partition is revoked or the
// Consumer stops (then nothing of it was written, and it is read again from
// the stored offset). The Middleware's own retries of serialization
// failures, deadlocks and lost connections (its idempotent.WithRetry
// policy) happen inside each attempt. Want 0 < initial <= max. Default is
// idempotent.DefaultRetryPolicy's bounds (5ms to 1s).
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetRetryDelay(initial, max)) })
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) a record's event time may be and wait in place until
// the clock catches up; a record dated further ahead is poison. While a
// record waits, its partition waits behind it (and the member fetches
// nothing new until the poll's records are done), so the default is short:
// the Middleware's clock-skew margin (idempotent.WithClockSkew, 5 minutes
// by default), after which a record dated ahead is dead-lettered with its
// reason (idempotent.ErrInvalidEventTime). It must be positive. Default is
// the clock-skew margin.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetFutureBound(d)) })
}

// WithWorkers sets how many partitions are applied at once, each by its
// own goroutine (and its own database connection: size the pool for it).
// Records of one partition are always applied one after another, in offset
// order. It must be 1 to adapter.MaxWorkers. Default is DefaultWorkers (4).
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetWorkers(n)) })
}

// WithShutdownTimeout bounds how long Run waits, after its context ends, for
// in-flight transactions to finish. When it runs out their contexts are
// cancelled: they roll back, and their records are read again by the next
// owner from the stored offset. It must be positive. Default is
// adapter.DefaultShutdownTimeout (30 seconds).
func WithShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetShutdownTimeout(d)) })
}

// WithPoison marks more of a handler's errors as poison: an error for which
// isPoison returns true dead-letters the record instead of retrying it. A
// record is poison if its error matches adapter.ErrPoison, if isPoison
// says so, or if adapter.Rule.Settle does (an invalid key, a record too old
// or too far in the future, a bad event-time header). Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return shared(c.ac.SetPoison(isPoison)) })
}

// WithMaxPollRecords bounds how many records one poll returns, over all
// partitions. A poll's records are finished (or released) before the group
// may rebalance, so this bounds how long a rebalance waits. The client
// hands out what it has buffered partition by partition, so a full poll of
// a backlog often holds one or two partitions' records: the Consumer then
// takes further polls of what is already buffered, without waiting, while
// its records are of fewer partitions than WithWorkers, up to WithWorkers
// polls in all, so that every worker has a partition to apply. It must be
// 1 to MaxPollRecords. Default is DefaultPollRecords (1000).
func WithMaxPollRecords(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > MaxPollRecords {
			return fmt.Errorf("kafka: WithMaxPollRecords: %d, want 1 to %d", n, MaxPollRecords)
		}
		c.maxPoll = n
		return nil
	})
}

// WithBatchSize bounds, for NewBatchConsumer, how many records one
// transaction claims: a poll's records of one partition are applied in
// batches of at most n, in offset order, each advancing the stored offset
// once. It must be 1 to idempotent.MaxBatchSize; NewConsumer refuses it.
// A batch is never larger than a poll's records of its partition (see
// WithMaxPollRecords). Default is idempotent.MaxBatchSize.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if !c.batch {
			return errors.New("kafka: WithBatchSize: for NewBatchConsumer only")
		}
		if n < 1 || n > idempotent.MaxBatchSize {
			return fmt.Errorf("kafka: WithBatchSize: %d, want 1 to %d", n, idempotent.MaxBatchSize)
		}
		c.batchSize = n
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
// with the record's event time (outbox.WithEventTime) where it had one,
// written in the transaction that advances the record's offset, so the row
// exists exactly once per poison record whatever crashes or rebalances
// happen. A Relay with DeadLetterSender produces the rows to Kafka. Without
// this option a poison record is dropped: its offset advances, nothing
// else is written, and the Observer is told (adapter.EventDeadLettered
// whose Detail is a Dropped). Default is none.
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
