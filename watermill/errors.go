package watermill

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent"
)

// Errors callers branch on; match them with errors.Is.
var (
	// ErrPoison marks an error as poison: redelivering the message would
	// fail the same way. Mark a handler's own errors with [Poison], and
	// route poison messages away with Watermill's
	// middleware.PoisonQueueWithFilter and [IsPoison].
	ErrPoison = errors.New("watermill: poison message")

	// ErrNoKey reports a message that carries no message key where its
	// KeyFunc looks (by default the metadata field [KeyMetadata]). It matches
	// idempotent.ErrInvalidKey, so the message is poison. Nothing was
	// written.
	ErrNoKey = fmt.Errorf("%w: message carries no message key", idempotent.ErrInvalidKey)

	// ErrProducedMessages reports a handler that returned messages to
	// publish while the middleware has no outbox (see WithOutbox). The
	// router would publish them after the commit and before the ack; if
	// that failed, the redelivery would be a duplicate and the messages
	// would never go out. The transaction is rolled back, so the message is
	// not marked seen.
	ErrProducedMessages = errors.New("watermill: handler produced messages, but the middleware has no outbox")

	// ErrNoTransaction is returned, in subscriber-transaction mode (see
	// WithSubscriberTx), for a message whose context carries no
	// transaction.
	ErrNoTransaction = errors.New("watermill: the message's context carries no subscriber transaction")
)

// Poison marks err as poison. The result matches both ErrPoison and err.
// Poison(nil) is nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// IsPoison reports whether err matches ErrPoison: the middleware marks
// with it every message the settle rule (adapter.Rule.Settle) calls poison
// — no key ([ErrNoKey]), an invalid key, a bad event-time value, an event
// time older than the retention window or further ahead of the clock than
// the rule's bound — and so does [Poison] for a handler's own errors. A
// message no redelivery can fix. Use it as the filter of Watermill's
// middleware.PoisonQueueWithFilter, placed outside (before) this
// middleware, so that such messages go to a poison topic, once, instead of
// being nacked forever. An error the rule requeues (a *RequeueError) is
// not poison, even where it matches idempotent.ErrInvalidEventTime (an
// event time a little ahead of the clock).
func IsPoison(err error) bool {
	return errors.Is(err, ErrPoison)
}
