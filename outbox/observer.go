package outbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// EventType says what an Event reports.
type EventType int

const (
	// EventEnqueued: Enqueue wrote a row in the caller's transaction. It
	// counts only if that transaction commits.
	EventEnqueued EventType = iota + 1
	// EventSent: a call succeeded and the row was marked sent.
	EventSent
	// EventFailed: a call failed and will be tried again after Backoff.
	EventFailed
	// EventDead: the row was marked dead — its last allowed attempt failed,
	// the sender returned a Permanent error, or the last attempt's lease
	// expired (ErrLeaseExpired). It will not be tried again.
	EventDead
	// EventLeaseLost: a call returned, but another relay had leased the row
	// by then (ErrLeaseLost); that relay will call again with the same key.
	// A sign that calls take longer than the lease.
	EventLeaseLost
	// EventRelayError: the relay could not lease rows, record a result, or
	// keep its LISTEN connection. It goes on (leases expire, polling
	// continues); Err says what failed.
	EventRelayError
	// EventListening: the relay's LISTEN connection is subscribed (again),
	// so commits wake it at once. The first time, it follows a round trip
	// of a test notification.
	EventListening
	// EventListenUnavailable: the relay's LISTEN connection did not
	// receive the test notification the relay sent itself within the
	// check timeout (WithListenerCheck). LISTEN cannot work through that
	// connection — typically PgBouncer in transaction mode sits in
	// between; point WithListener at the server or at a session-mode pool.
	// The relay closed the connection and polls only; Err wraps
	// ErrListenUnavailable.
	EventListenUnavailable
)

// String returns the event type's name, such as "sent".
func (t EventType) String() string {
	switch t {
	case EventEnqueued:
		return "enqueued"
	case EventSent:
		return "sent"
	case EventFailed:
		return "failed"
	case EventDead:
		return "dead"
	case EventLeaseLost:
		return "lease_lost"
	case EventRelayError:
		return "relay_error"
	case EventListening:
		return "listening"
	case EventListenUnavailable:
		return "listen_unavailable"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// An Event describes one thing that happened to an outbox row or a relay.
// Fields that do not apply to its Type are zero.
type Event struct {
	// Type says what happened.
	Type EventType
	// Relay is the relay's id ("" for EventEnqueued).
	Relay string
	// ID is the row's id.
	ID int64
	// Consumer is the consumer that enqueued the row.
	Consumer string
	// MessageKey is the key of the message whose handler enqueued it.
	MessageKey string
	// Kind is the row's kind.
	Kind string
	// IdempotencyKey is the key sent with every attempt.
	IdempotencyKey string
	// Attempt is the number of the attempt (1 for the first).
	Attempt int
	// Duration is how long the sender's call took.
	Duration time.Duration
	// Backoff is how long until the next attempt (EventFailed).
	Backoff time.Duration
	// Err is the call's error (EventFailed, EventDead, EventLeaseLost) or
	// the relay's (EventRelayError).
	Err error
}

// An Observer is told of every Event, synchronously, on the goroutine that
// caused it: Enqueue's caller, or one of a relay's goroutines. Its methods
// must be safe for concurrent use and should return quickly.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Counts is an Observer that counts events by type. The zero value is ready
// to use.
type Counts struct {
	n [EventListenUnavailable + 1]atomic.Int64
}

var _ Observer = (*Counts)(nil)

// Observe counts e.
func (c *Counts) Observe(_ context.Context, e Event) {
	if e.Type > 0 && int(e.Type) < len(c.n) {
		c.n[e.Type].Add(1)
	}
}

// Count returns how many events of type t were observed.
func (c *Counts) Count(t EventType) int64 {
	if t <= 0 || int(t) >= len(c.n) {
		return 0
	}
	return c.n[t].Load()
}
