package watermill

import (
	"errors"
	"fmt"
	"time"
)

// ErrNoTransaction is returned, in subscriber-transaction mode (see
// [WithSubscriberTx]), for a message whose context carries no subscriber
// transaction. The router nacks it; nothing was written.
var ErrNoTransaction = errors.New("watermill: the message's context carries no subscriber transaction")

// RequeueError is the error the handler returns for a message that the
// settle rule (adapter.Rule.Settle) gives back to the broker: a handler
// error, a claim the transaction could not make (idempotent.ErrClaimBusy,
// idempotent.ErrNoPartition, a retryable failure past the retry policy),
// or an event time ahead of the clock by less than the future bound. The
// router nacks the message, nothing written, and the Pub/Sub delivers it
// again. Err is the error the Middleware (or the handler) returned,
// matched through it with errors.Is and errors.As.
//
// Delay is how long the rule says to wait before the message is given
// again — for a future-dated one, until the clock has caught up. A
// Watermill nack carries no delay: GoChannel and watermill-amqp deliver a
// nacked message again at once, so nothing waits unless a router
// middleware does (middleware.Retry, whose own intervals apply, or one of
// yours that reads Delay). The handler itself never sleeps.
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
