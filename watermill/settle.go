package watermill

import (
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// RequeueError is the error the middleware returns for a message that the
// settle rule (adapter.Rule.Settle) gives back to the broker: a handler
// error, a claim the transaction could not make (idempotent.ErrClaimBusy,
// idempotent.ErrNoPartition, a retryable failure past the retry policy), or
// an event time ahead of the clock by less than adapter.DefaultFutureBound.
// The router nacks the message, and Err is the error the Middleware (or
// the handler) returned, matched through it with errors.Is and errors.As.
//
// Delay is how long the rule says to wait before the message is given
// again — for a future-dated one, until the clock has caught up. A
// Watermill Nack carries no delay: GoChannel and watermill-amqp deliver a
// nacked message again at once, so nothing waits unless something outside
// this middleware does (middleware.Retry outside it, whose own intervals
// apply, or a delayed requeue through a poison topic, a
// components/requeuer and a Pub/Sub that honours delay metadata). The
// middleware itself never sleeps: a message it requeues holds no
// transaction and no handler.
type RequeueError struct {
	// Delay is the rule's wait before the next delivery.
	Delay time.Duration
	// Err is the error that requeues the message.
	Err error
}

// Error returns Err's message and the delay.
func (e *RequeueError) Error() string {
	return fmt.Sprintf("%v (requeue, next delivery in %v)", e.Err, e.Delay)
}

// Unwrap returns Err.
func (e *RequeueError) Unwrap() error { return e.Err }

// settle turns the Middleware's answer err for m (nil for Applied and
// Duplicate) into what the middleware returns to the router, through the
// one settle rule: nil (ack), a *RequeueError (nack), or an error matching
// ErrPoison (for a middleware.PoisonQueueWithFilter with IsPoison). An
// error the handler marked with Poison stays poison.
func (c *config) settle(m idempotent.Message, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrPoison) {
		return err
	}
	d := c.rule.Settle(m, err, 1)
	switch d.Action {
	case adapter.Ack:
		return nil
	case adapter.DeadLetter:
		return Poison(err)
	}
	return &RequeueError{Delay: d.Delay, Err: err}
}
