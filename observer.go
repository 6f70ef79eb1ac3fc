package idempotent

import (
	"context"
	"sync/atomic"
	"time"
)

// Event describes how one delivery ended.
type Event struct {
	// Consumer is the Middleware's consumer name.
	Consumer string
	// Key is the message key as given to ProcessMessage (Message.Key).
	Key string
	// Outcome is Applied or Duplicate, or 0 when Err is set.
	Outcome Outcome
	// Attempts is how many transactions were run (1 without retries; 0 when
	// the key was rejected before any transaction).
	Attempts int
	// Duration is the time from the call to its return, retries included.
	Duration time.Duration
	// Err is the error returned to the caller, or nil.
	Err error
}

// RetryEvent describes one failed attempt that is about to be retried.
type RetryEvent struct {
	// Consumer is the Middleware's consumer name.
	Consumer string
	// Key is the message key as given to ProcessMessage (Message.Key),
	// or "" for a batch.
	Key string
	// Attempt is the number of the attempt that failed (1 for the first).
	Attempt int
	// Reason is the dialect's kind of failure: "serialization" or
	// "connection"; or "lock_timeout" for a coalesced message whose
	// handler waited past Coalescing.LockWait and that runs again alone.
	Reason string
	// Code is the database's error code (an SQLSTATE such as "40001"), or
	// "" when the failure carried none, as for a dropped socket.
	Code string
	// Err is the attempt's error.
	Err error
	// Backoff is how long the middleware sleeps before the next attempt.
	Backoff time.Duration
}

// An Observer is told of every outcome and every retry, synchronously, on the
// goroutine that called ProcessMessage (or another entry point). Its methods must be safe for concurrent use
// and should return quickly. An Observer that also implements [Starter] is
// told when each delivery starts, and chooses the context it runs with. The
// otelmetrics package adapts it to OpenTelemetry metrics and traces; Counts
// is a ready-made in-memory one.
type Observer interface {
	// Outcome is called once per ProcessMessage call (or per message of
	// a ProcessMessages call), when it returns.
	Outcome(ctx context.Context, e Event)
	// Retry is called after a failed attempt, before the backoff sleep.
	Retry(ctx context.Context, e RetryEvent)
}

// Counts is an Observer that counts outcomes and retries in memory. The zero
// value is ready to use. Its Duplicates figure is the guide's duplicate
// counter: the real redelivery rate of a broker and consumer.
type Counts struct {
	applied, duplicates, failed, retries atomic.Int64
}

var _ Observer = (*Counts)(nil)

// Outcome counts e.
func (c *Counts) Outcome(_ context.Context, e Event) {
	switch {
	case e.Err != nil:
		c.failed.Add(1)
	case e.Outcome == Applied:
		c.applied.Add(1)
	case e.Outcome == Duplicate:
		c.duplicates.Add(1)
	}
}

// Retry counts a retry.
func (c *Counts) Retry(context.Context, RetryEvent) { c.retries.Add(1) }

// Applied returns how many deliveries applied their effect.
func (c *Counts) Applied() int64 { return c.applied.Load() }

// Duplicates returns how many deliveries were found already applied.
func (c *Counts) Duplicates() int64 { return c.duplicates.Load() }

// Failed returns how many deliveries returned an error.
func (c *Counts) Failed() int64 { return c.failed.Load() }

// Retries returns how many attempts were retried.
func (c *Counts) Retries() int64 { return c.retries.Load() }
