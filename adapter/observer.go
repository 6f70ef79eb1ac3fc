package adapter

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent"
)

// EventType says what an Event reports. Every adapter reports the same
// types; the ones a transport has no use for (a rebalance for RabbitMQ)
// never occur there.
type EventType int

const (
	// EventApplied: a delivery's claim was new; its effect committed with
	// it, and the delivery was acknowledged (its offset stored).
	EventApplied EventType = iota + 1
	// EventDuplicate: a delivery's claim existed (a redelivery, a re-send,
	// or a message applied before a crash); it was acknowledged with no
	// effect.
	EventDuplicate
	// EventRequeued: a delivery failed with an error a redelivery may fix;
	// nothing was written, and it is given again after Delay (handed back
	// to the broker, or retried in place where the transport is a log).
	EventRequeued
	// EventDeadLettered: a poison delivery was dead-lettered, terminated
	// or dropped — whichever the adapter's doc says — exactly once, with
	// nothing of its effect written. Err says why.
	EventDeadLettered
	// EventReleased: deliveries were handed back unprocessed, nothing
	// written, because the consumer was stopping or lost the right to
	// them (a rebalance); whoever consumes them next applies them.
	EventReleased
	// EventSettleFailed: the acknowledgement (or requeue, or
	// dead-lettering) could not be sent; Err says why. Nothing is lost:
	// the broker delivers the message again, and if its effect committed,
	// the claim makes it a duplicate.
	EventSettleFailed
	// EventStopped: the consumer stopped applying a source (a partition)
	// until it is given it again, because going on would skip or double
	// something; Err says why.
	EventStopped
	// EventFenced: a position the consumer stores in the database was
	// found moved by another owner; the transaction rolled back and the
	// source is read again from the stored position.
	EventFenced
	// EventAssigned, EventRevoked and EventLost: the consumer group gave
	// the consumer sources, took them back, or the consumer lost them.
	// Detail describes them.
	EventAssigned
	EventRevoked
	EventLost
	// EventFetchError: the client reported an error while fetching, which
	// it retries.
	EventFetchError
	// EventCommitFailed: a commit of positions to the broker, made for lag
	// tools only, failed. Nothing is lost: the database's positions are
	// the ones the consumer reads from.
	EventCommitFailed

	eventTypes = iota + 1 // one past the last
)

var eventNames = [eventTypes]string{
	EventApplied:      "applied",
	EventDuplicate:    "duplicate",
	EventRequeued:     "requeued",
	EventDeadLettered: "dead-lettered",
	EventReleased:     "released",
	EventSettleFailed: "settle-failed",
	EventStopped:      "stopped",
	EventFenced:       "fenced",
	EventAssigned:     "assigned",
	EventRevoked:      "revoked",
	EventLost:         "lost",
	EventFetchError:   "fetch-error",
	EventCommitFailed: "commit-failed",
}

// String returns the type's name, such as "applied".
func (t EventType) String() string {
	if t > 0 && int(t) < eventTypes {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event describes something a consumer did. Fields that do not apply to
// the event's Type are zero.
type Event struct {
	// Type says what happened.
	Type EventType
	// Message is the delivery's key and event time, as far as they could
	// be read (a delivery whose key could not be read has none).
	Message idempotent.Message
	// Source says where the delivery came from, for logs: a topic,
	// partition and offset; a queue and delivery tag; a stream and
	// sequence.
	Source string
	// Attempt is the delivery's attempt (1 for the first) of an
	// EventRequeued, EventApplied or EventDuplicate, where the adapter
	// counts them.
	Attempt int
	// Delay is the wait before an EventRequeued's delivery is given again.
	Delay time.Duration
	// Err is the error of an EventRequeued, EventDeadLettered,
	// EventSettleFailed, EventStopped, EventFenced, EventFetchError or
	// EventCommitFailed.
	Err error
	// Detail is the adapter's own description: the delivery itself
	// (*amqp091.Delivery, *kgo.Record, jetstream.Msg, *message.Message)
	// for delivery events, the sources for a rebalance. Each adapter's doc
	// says which.
	Detail any
}

// An Observer is told of every delivery's outcome and every event of the
// consumer, synchronously, on the goroutine that did it. Its method must
// be safe for concurrent use and return quickly.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Stats counts what a consumer did, over all its runs, by event type.
// Every delivery a consumer finished is in exactly one of Applied,
// Duplicates, DeadLettered (a requeued delivery is counted again when it
// comes back).
type Stats struct {
	Applied, Duplicates, Requeued, DeadLettered, Released int64
	SettleFailed, Stopped, Fenced                         int64
	Assigned, Revoked, Lost, FetchErrors, CommitFailed    int64
}

// Counter is an Observer that counts events by type, and passes each on to
// Next when it is set. Adapters put one in front of the user's Observer
// for their Stats. Its zero value is ready to use.
type Counter struct {
	// Next hears every event after it is counted.
	Next Observer

	n [eventTypes]atomic.Int64
}

// Observe counts e and passes it on to c.Next.
func (c *Counter) Observe(ctx context.Context, e Event) {
	if e.Type > 0 && int(e.Type) < eventTypes {
		c.n[e.Type].Add(1)
	}
	if c.Next != nil {
		c.Next.Observe(ctx, e)
	}
}

// Stats returns the counts so far.
func (c *Counter) Stats() Stats {
	g := func(t EventType) int64 { return c.n[t].Load() }
	return Stats{
		Applied: g(EventApplied), Duplicates: g(EventDuplicate), Requeued: g(EventRequeued),
		DeadLettered: g(EventDeadLettered), Released: g(EventReleased), SettleFailed: g(EventSettleFailed),
		Stopped: g(EventStopped), Fenced: g(EventFenced), Assigned: g(EventAssigned), Revoked: g(EventRevoked),
		Lost: g(EventLost), FetchErrors: g(EventFetchError), CommitFailed: g(EventCommitFailed),
	}
}
