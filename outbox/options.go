package outbox

import (
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// DefaultTable is the outbox table's name when WithTable is not given.
const DefaultTable = "outbox"

// DefaultCleanupBatch is how many rows one Cleanup statement deletes at most
// when WithCleanupBatch is not given.
const DefaultCleanupBatch = 10000

// An Option configures an Outbox. Options are checked by New: a bad value is
// an error from New, never a surprise at the first message.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	table        string
	observer     Observer
	notify       bool
	cleanupBatch int
	tracer       Tracer
}

// WithTable sets the outbox table, as "table" or "schema.table". Each part
// must be a plain identifier (letters, digits and underscores, not starting
// with a digit, at most 63 bytes); it is quoted in every statement. The
// schema must exist. Default is "outbox".
func WithTable(name string) Option {
	return optionFunc(func(c *config) error {
		c.table = name
		return nil
	})
}

// WithObserver sets the observer told of enqueued rows and of everything the
// relays built on this Outbox do. Default is none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return errors.New("outbox: WithObserver: nil observer")
		}
		c.observer = o
		return nil
	})
}

// WithoutNotify makes Enqueue skip pg_notify. Use it when no relay listens:
// a notifying transaction takes a database-wide lock briefly at commit,
// which a very busy database may notice. Relays then find rows by polling
// only. Default is to notify.
func WithoutNotify() Option {
	return optionFunc(func(c *config) error {
		c.notify = false
		return nil
	})
}

// WithCleanupBatch sets how many rows one Cleanup statement deletes at
// most; each batch is its own short transaction. Default is
// DefaultCleanupBatch (10,000).
func WithCleanupBatch(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("outbox: WithCleanupBatch: %d is not a positive batch size", n)
		}
		c.cleanupBatch = n
		return nil
	})
}

// An EnqueueOption adjusts one Enqueue call.
type EnqueueOption interface {
	applyEnqueue(*enqueueConfig) error
}

type enqueueOptionFunc func(*enqueueConfig) error

func (f enqueueOptionFunc) applyEnqueue(c *enqueueConfig) error { return f(c) }

type enqueueConfig struct {
	key      string
	at       time.Time
	orderKey string
	orderSeq int64
}

// order returns the order_key and order_seq parameters, NULL when the call
// was enqueued without WithOrder.
func (c *enqueueConfig) order() (key, seq any) {
	if c.orderKey == "" {
		return nil, nil
	}
	return c.orderKey, c.orderSeq
}

// eventTime returns the event_time and event_time_ns parameters, NULL
// when unknown. A timestamptz keeps microseconds, and Postgres rounds a
// finer time to the nearest one: 23:59:59.9999996Z would be stored as the
// next day's midnight. So event_time is the event time truncated to its
// microsecond, sent exact — never a later day, as a day starts on a whole
// microsecond — and event_time_ns the nanoseconds below it (0 to 999);
// eventTimeOf adds them back. The time is stored without loss.
func (c *enqueueConfig) eventTime() (at, ns any) {
	if c.at.IsZero() {
		return nil, nil
	}
	t := c.at.UTC()
	below := t.Nanosecond() % int(time.Microsecond)
	return t.Add(-time.Duration(below)), int16(below)
}

// eventTimeOf is the event time of a row whose event_time and
// event_time_ns are at and ns: the zero time when at is NULL. A row
// written without event_time_ns (before it existed) has its event_time
// alone.
func eventTimeOf(at sql.NullTime, ns sql.NullInt16) time.Time {
	if !at.Valid {
		return time.Time{}
	}
	return at.Time.Add(time.Duration(ns.Int16))
}

// WithEventTime stores t, the event time of the message whose handler
// enqueues the call, with the row, to the nanosecond; the Sender finds it
// in Message.EventTime, the same instant. A Sender that publishes the call as a message (a
// dead letter, a message to a broker) carries it forward in the
// adapter.EventTimeHeader header, so that the consumer of the re-sent
// message claims it under its original event time — the same day's
// partition, the same retention fence — rather than the time of the
// re-send. t must not be the zero time.
func WithEventTime(t time.Time) EnqueueOption {
	return enqueueOptionFunc(func(c *enqueueConfig) error {
		if t.IsZero() {
			return errors.New("WithEventTime: the zero time")
		}
		c.at = t
		return nil
	})
}

// WithKey sets the idempotency key sent with the call, instead of the one
// derived by Key from the consumer, the message key and the kind. Use it to
// enqueue several calls of one kind for one message, or to reuse a key the
// provider already knows. It must be 1 to MaxIdempotencyKeyBytes bytes of
// visible ASCII. Keys are unique per kind.
func WithKey(key string) EnqueueOption {
	return enqueueOptionFunc(func(c *enqueueConfig) error {
		if err := checkIdempotencyKey(key); err != nil {
			return err
		}
		c.key = key
		return nil
	})
}

// WithOrder stores, with the row, the ordering key (the entity: an
// account, an order) and the sequence number the producer assigned for
// that entity (its version, 1, 2, 3, … without gaps, incremented in the
// transaction that enqueues the call). The Sender finds them in
// Message.OrderKey and Message.OrderSeq, and a Sender that publishes the
// call as a message carries them in the adapter.OrderKeyHeader and
// adapter.OrderSeqHeader headers, where a consumer created
// idempotent.WithOrdering applies the entity's messages in that order
// (docs/ordering.md). key must be 1 to MaxOrderKeyBytes bytes of valid
// UTF-8 without control characters and seq at least 1; otherwise Enqueue
// fails with an error matching ErrInvalidOrder, naming the problem, and
// writes nothing.
func WithOrder(key string, seq int64) EnqueueOption {
	return enqueueOptionFunc(func(c *enqueueConfig) error {
		if err := checkOrder(key, seq); err != nil {
			return fmt.Errorf("WithOrder: %w", err)
		}
		c.orderKey, c.orderSeq = key, seq
		return nil
	})
}
