package idempotent

import (
	"errors"
	"fmt"
)

// Errors callers branch on. Match them with errors.Is: the middleware always
// wraps them with the consumer, key or cause.
var (
	// ErrInvalidKey reports a message key that cannot be claimed: empty,
	// not valid UTF-8, containing NUL, longer than the dialect's limit, or
	// one that a wrapper's message function failed to produce. Nothing was written.
	// The message is poison: redelivering it will fail the same way.
	ErrInvalidKey = errors.New("idempotent: invalid message key")

	// ErrAutocommit reports that the handler's effect did not stay inside the
	// claim's transaction: a statement ran with the handler's context on
	// another connection (db.ExecContext instead of tx.ExecContext), the
	// handler committed or rolled back the transaction itself, the strict
	// guard found the session in another transaction before commit, a
	// transaction was begun inside a handler with the handler's context
	// (RunTx, or ProcessMessage of any Middleware), or the handler went on
	// after the database rolled its transaction back (a deadlock it
	// swallowed, on MySQL) or, in a coalesced group, after an error that
	// aborted it. The transaction is rolled back where it still can be. This
	// is a bug in the handler, not a transient failure: it is never
	// retried.
	ErrAutocommit = errors.New("idempotent: statement outside the claim's transaction")

	// ErrRetriesExhausted reports that every attempt allowed by the retry
	// policy failed with a retryable error. The error also matches a
	// *RetriesExhaustedError, whose Err is the last attempt's failure.
	ErrRetriesExhausted = errors.New("idempotent: retries exhausted")

	// ErrClaimBusy reports that another transaction holds the same claim and
	// did not finish within the lock timeout set by WithLockTimeout. Nothing
	// was written; deliver the message again later.
	ErrClaimBusy = errors.New("idempotent: claim held by another transaction")

	// ErrInvalidConsumer reports a consumer name New cannot use: empty,
	// longer than MaxConsumerBytes, or with characters other than ASCII
	// letters, digits and . _ - : / (starting with a letter or digit).
	ErrInvalidConsumer = errors.New("idempotent: invalid consumer name")

	// ErrNoClaimTable reports that the claim table does not exist. Run
	// EnsureSchema, or the migration, first.
	ErrNoClaimTable = errors.New("idempotent: claim table does not exist")
)

// RetriesExhaustedError is returned when the last attempt allowed by the
// retry policy failed with a retryable error. It matches ErrRetriesExhausted
// with errors.Is, and unwraps to the last attempt's error.
type RetriesExhaustedError struct {
	// Attempts is how many times the transaction was run.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

// Error describes the failure.
func (e *RetriesExhaustedError) Error() string {
	return fmt.Sprintf("idempotent: retries exhausted after %d attempts: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *RetriesExhaustedError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRetriesExhausted.
func (e *RetriesExhaustedError) Is(target error) bool { return target == ErrRetriesExhausted }
