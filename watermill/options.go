package watermill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// An Option configures [NewHandler]. A bad option is an error from
// NewHandler.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config is NewHandler's configuration: what every adapter shares, and the
// subscriber's transaction.
type config struct {
	adapter.Config[*message.Message]
	subscriberTx func(ctx context.Context) (*sql.Tx, bool)
}

// WithKey sets where the message key comes from: [Header] for a metadata
// field of the producer's, [BodyField] for a field of a JSON payload,
// [Prefixed] to keep the keys of several message types apart, or a
// function of your own. Default is [UUID], the message's UUID.
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetKey(k)) })
}

// WithEventTime sets where each message's event time comes from: a
// metadata field of the producer's own ([TimeHeader]) or a function over the
// payload. It must read a time the producer set: a time a Pub/Sub stamps
// on each publish (a broker's arrival time, a Kafka record timestamp
// Watermill copies into the metadata) is new on every re-send, so a re-send
// after UTC midnight would land in another day's partition and be applied
// again. A message for which f fails, or returns the zero time, is poison.
// Default is the metadata field adapter.EventTimeHeader, as
// adapter.FormatEventTime writes it; a message without it has no event
// time (poison only in partitioned mode).
func WithEventTime(f EventTimeFunc) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetEventTime(f)) })
}

// WithoutEventTime reads no event time: every message is claimed by its
// key alone and the retention fence cannot apply. NewHandler refuses it
// for a Middleware in partitioned mode (idempotent.WithDailyPartitions),
// whose claims need their event day, with an error matching
// adapter.ErrNoProducerEventTime. Default is the metadata field
// adapter.EventTimeHeader (see [WithEventTime]).
func WithoutEventTime() Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetNoEventTime()) })
}

// WithObserver sets the Observer told of each message's outcome, with
// Event.Detail the *message.Message: adapter.EventApplied,
// adapter.EventDuplicate, adapter.EventRequeued (the handler returned an
// error for the router to nack) or adapter.EventDeadLettered (it returned
// a poison error for the router's PoisonQueue) — exactly one per call of
// the handler, synchronously, before the handler returns. For counts, give
// an *adapter.Counter and read its Stats. Default is none.
func WithObserver(o adapter.Observer) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetObserver(o)) })
}

// WithTracer traces the messages with t (package oteltrace gives one):
// each message's transaction is a span that continues the trace of the
// producer whose context the message carries in its metadata. Default is
// none.
func WithTracer(t adapter.Tracer) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetTracer(t)) })
}

// WithRetryDelay sets the delays the settle rule gives a requeued message
// (RequeueError.Delay, Event.Delay): initial, doubling with jitter up to
// max, as idempotent.RetryPolicy.Backoff computes them. Watermill counts no
// deliveries, so every message gets the first attempt's delay. A Watermill
// nack carries no delay; see the package documentation for what waits.
// Default is idempotent.DefaultRetryPolicy's.
func WithRetryDelay(initial, max time.Duration) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetRetryDelay(initial, max)) })
}

// WithFutureBound sets how far ahead of the Middleware's clock (past its
// clock-skew margin) a message's event time may be and the message be
// requeued until the clock catches up; one further ahead is poison. Some
// subscribers redeliver a nacked message before any behind it (Watermill's
// Kafka and SQL subscribers: the partition or table waits), so the default
// is short: the Middleware's clock-skew margin (idempotent.WithClockSkew).
// Behind a subscriber where other messages pass a nacked one (GoChannel,
// AMQP), adapter.DefaultFutureBound lets a message dated up to an hour
// ahead wait instead of going to the poison queue. Default is the
// clock-skew margin.
func WithFutureBound(d time.Duration) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetFutureBound(d)) })
}

// WithPoison marks more of the handler's errors as poison, besides those
// matching adapter.ErrPoison (adapter.Poison, adapter.ErrUndecodable):
// isPoison is asked about every error the handler returns. The handler then
// returns them marked with adapter.Poison, for the router's PoisonQueue.
// Default is none.
func WithPoison(isPoison func(error) bool) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetPoison(isPoison)) })
}

// WithSubscriberTx makes the handler claim in the transaction the
// subscriber consumes the message in, rather than in one of its own, so
// that the claim, the effect and the subscriber's offset commit together.
// txOf returns that transaction from the message's context. With the
// watermill-sql (v4) subscriber:
//
//	idwm.WithSubscriberTx(func(ctx context.Context) (*sql.Tx, bool) {
//		tx, ok := wsql.TxFromContext(ctx)
//		if !ok {
//			return nil, false
//		}
//		std, ok := tx.(*wsql.StdSQLTx)
//		if !ok {
//			return nil, false
//		}
//		return std.Tx, true
//	})
//
// The subscriber commits its transaction; the handler neither commits nor
// retries, and reports adapter.EventApplied once the claim and the effect
// are written in it. Each call runs under a savepoint, rolled back when
// the claim or the effect fails: watermill-sql resends a nacked message in
// the same transaction (and shares one transaction among a batch of
// messages), so without it a failed attempt's claim would stay and mark the
// message seen. The claim table must be in the subscriber's database. A
// message without a transaction fails with [ErrNoTransaction]. Default is
// off: the handler begins, retries and commits its own transaction on the
// *sql.DB of its idempotent.Middleware.
func WithSubscriberTx(txOf func(ctx context.Context) (*sql.Tx, bool)) Option {
	return optionFunc(func(c *config) error {
		if txOf == nil {
			return errors.New("watermill: WithSubscriberTx: nil function")
		}
		c.subscriberTx = txOf
		return nil
	})
}

// WithTenant applies each message with its tenant's Middleware in ts, for
// tenants that each have a database of their own: tenant names a message's
// tenant (from its metadata or payload). NewHandler is then given a nil
// Middleware. A message whose tenant's database cannot be reached is
// requeued (a [*RequeueError]: the router nacks it) like any transaction
// failure, never acked, and the other tenants' messages go on; a message
// whose tenant cannot be read is poison. WithSubscriberTx is refused with
// it: the subscriber's transaction is on one database, the tenants' claim
// tables on many. See adapter.Config.SetTenant. Default: no tenants.
func WithTenant(ts *idempotent.Tenants, tenant func(msg *message.Message) (string, error)) Option {
	return optionFunc(func(c *config) error { return wrapOpt(c.SetTenant(ts, tenant)) })
}

// wrapOpt names the adapter in an option's error.
func wrapOpt(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("watermill: %w", err)
}
