package outbox

import (
	"errors"
	"fmt"
)

// Errors callers branch on. Match them with errors.Is: the package wraps
// them with the detail of what was wrong.
var (
	// ErrInvalidKind reports a kind that is empty, too long or has
	// characters other than ASCII letters, digits and . _ - : /.
	ErrInvalidKind = errors.New("outbox: invalid kind")

	// ErrInvalidPayload reports a payload that is nil, empty, not valid
	// JSON or not valid UTF-8.
	ErrInvalidPayload = errors.New("outbox: invalid payload")

	// ErrInvalidKey reports a message key or idempotency key that cannot be
	// stored or sent.
	ErrInvalidKey = errors.New("outbox: invalid key")

	// ErrInvalidOrder reports an ordering key or sequence (WithOrder) that
	// a consumer created WithOrdering could not use: see WithOrder.
	ErrInvalidOrder = errors.New("outbox: invalid order")

	// ErrDuplicateKey reports that a row with the same kind and idempotency
	// key already exists (or is being written by a transaction still in
	// flight, which Enqueue waited for). Nothing was written and the
	// caller's transaction is still usable: the call is already in the
	// outbox. A handler that enqueues two calls of one kind for one message
	// must give each its own key with WithKey.
	ErrDuplicateKey = errors.New("outbox: duplicate idempotency key")

	// ErrNoTable reports that the outbox table does not exist. Run
	// EnsureSchema, or the migration, first.
	ErrNoTable = errors.New("outbox: table does not exist")

	// ErrPermanent marks a Sender's error as one that retrying cannot fix,
	// such as a request the provider rejects as malformed: the row is
	// marked dead at once. Wrap an error with Permanent to return it.
	ErrPermanent = errors.New("outbox: permanent failure")

	// ErrLeaseExpired is the error of a row whose last allowed attempt
	// ended with its lease expiring: the relay that held it stopped without
	// recording a result. The row is marked dead with it.
	ErrLeaseExpired = errors.New("outbox: lease expired on the last attempt")

	// ErrLeaseLost is the error of an EventLeaseLost: the call returned,
	// but by then another relay had leased the row, so this relay did not
	// record the result. The other relay calls again with the same
	// idempotency key.
	ErrLeaseLost = errors.New("outbox: lease lost before the result was recorded")

	// ErrListenUnavailable is the error of an EventListenUnavailable: the
	// relay's LISTEN connection did not receive the notification the relay
	// sent itself, so LISTEN cannot work through that connection — as
	// behind a pooler in transaction or statement mode such as PgBouncer,
	// which hands the subscribed server connection to other clients. The
	// relay polls only.
	ErrListenUnavailable = errors.New("outbox: LISTEN does not receive notifications on this connection")
)

// Permanent wraps err so that the relay marks the row dead at once instead
// of retrying it. The result matches ErrPermanent and err with errors.Is.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return fmt.Sprintf("permanent: %v", e.err) }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }
