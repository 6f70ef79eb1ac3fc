package adapter

import (
	"errors"
	"time"

	"github.com/txclaim/idempotent"
)

// Action is what an adapter does with a delivery.
type Action int

const (
	// Ack acknowledges the delivery (commits the offset): the effect is
	// applied, now or before.
	Ack Action = iota + 1
	// Requeue hands the delivery back to the broker to be delivered again
	// after Decision.Delay, nothing written.
	Requeue
	// DeadLetter dead-letters (or terminates) the delivery, exactly once,
	// nothing written: it is poison, and delivering it again cannot
	// succeed.
	DeadLetter
)

// String returns "ack", "requeue" or "dead-letter".
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Requeue:
		return "requeue"
	case DeadLetter:
		return "dead-letter"
	}
	return "none"
}

// Decision is Rule.Settle's answer.
type Decision struct {
	// Action is what to do.
	Action Action
	// Delay is how long to wait before the delivery is given again, for
	// Requeue.
	Delay time.Duration
	// Err is the Middleware's error, nil for Ack.
	Err error
}

// DefaultFutureBound is Rule.FutureBound when it is zero on a transport
// that is not Rule.Ordered (a queue): a message dated up to an hour ahead
// of the clock (plus the clock-skew margin) is requeued until the clock
// catches up; one further ahead is poison. On an ordered transport the
// default bound is the clock-skew margin itself (see Rule.Ordered).
const DefaultFutureBound = time.Hour

// Rule is the settle rule of an adapter. The zero Rule uses the
// Middleware's defaults: idempotent.DefaultRetryPolicy for backoffs,
// DefaultFutureBound and time.Now.
type Rule struct {
	// Backoff is the policy whose Backoff(attempt) delays a requeue.
	// Default idempotent.DefaultRetryPolicy().
	Backoff idempotent.RetryPolicy
	// FutureBound is how far past the clock plus the clock-skew margin an
	// event time may be and still be requeued until the clock catches up:
	// the longest a delivery dated ahead waits. Default DefaultFutureBound,
	// or the clock-skew margin when Ordered.
	FutureBound time.Duration
	// Ordered says that a delivery waiting to be given again holds back
	// the deliveries behind it (a Kafka partition waits in place for its
	// record). A message dated ahead would stop them all while it waits, so
	// the default FutureBound is then the clock-skew margin (ClockSkew):
	// no delivery holds the others longer than that margin, and one dated
	// further ahead is poison, dead-lettered with its reason. A queue,
	// where the others pass a waiting delivery, keeps DefaultFutureBound.
	Ordered bool
	// ClockSkew is the Middleware's clock-skew margin (its
	// Config().ClockSkew). Default idempotent.DefaultClockSkew; the Rule
	// of Config.Rule takes the Middleware's margin as it is, zero (a
	// Middleware created WithClockSkew(0)) included.
	ClockSkew time.Duration
	// skewSet says ClockSkew is the Middleware's, zero included.
	skewSet bool
	// Now is the clock (the Middleware's Config().Clock). Default
	// time.Now.
	Now func() time.Time
	// IsPoison, when set, marks more of a handler's errors as poison,
	// besides those matching ErrPoison.
	IsPoison func(error) bool
}

// Settle decides what to do with a delivery of msg once the Middleware has
// answered err (nil for Applied or Duplicate). attempt counts this
// message's deliveries from 1, for the backoff.
func (r Rule) Settle(msg idempotent.Message, err error, attempt int) Decision {
	if err == nil {
		return Decision{Action: Ack}
	}
	switch {
	case IsPoison(err), r.IsPoison != nil && r.IsPoison(err),
		errors.Is(err, idempotent.ErrBeyondRetention),
		errors.Is(err, idempotent.ErrInvalidKey),
		errors.Is(err, idempotent.ErrInvalidOrder),
		errors.Is(err, idempotent.ErrSkippedSequence),
		errors.Is(err, idempotent.ErrBatchTooLarge),
		errors.Is(err, idempotent.ErrAutocommit):
		return Decision{Action: DeadLetter, Err: err}
	case errors.Is(err, idempotent.ErrInvalidEventTime):
		now := r.now()
		ahead := msg.EventTime.Sub(now) - r.skew()
		if msg.EventTime.IsZero() || errors.Is(err, ErrBadEventTime) || errors.Is(err, ErrNoEventTime) || ahead > r.futureBound() {
			return Decision{Action: DeadLetter, Err: err}
		}
		// Dated ahead of the clock, within the bound: give it again when
		// the clock has caught up.
		return Decision{Action: Requeue, Delay: max(ahead, r.Delay(attempt)), Err: err}
	}
	return Decision{Action: Requeue, Delay: r.Delay(attempt), Err: err}
}

func (r Rule) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r Rule) skew() time.Duration {
	if r.ClockSkew > 0 || r.skewSet {
		return r.ClockSkew
	}
	return idempotent.DefaultClockSkew
}

func (r Rule) futureBound() time.Duration {
	switch {
	case r.FutureBound > 0:
		return r.FutureBound
	case r.Ordered:
		return r.skew()
	}
	return DefaultFutureBound
}

// Delay is the requeue delay of a delivery's attempt (1 for the first):
// Backoff's, or idempotent.DefaultRetryPolicy's when Backoff is the zero
// RetryPolicy. Settle requeues with it; an adapter requeueing a delivery
// for a reason of its own (a dead letter that did not commit) uses it too.
func (r Rule) Delay(attempt int) time.Duration {
	p := r.Backoff
	if p.MaxAttempts == 0 && p.InitialBackoff == 0 && p.MaxBackoff == 0 {
		p = idempotent.DefaultRetryPolicy()
	}
	return p.Backoff(max(attempt, 1))
}
