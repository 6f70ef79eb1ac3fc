package dialect

import (
	"time"
)

// Dialect builds the SQL text the middleware runs and classifies the errors
// a database returns. A Dialect never runs a statement itself: every method
// returns text or a classification, so each one can be golden-tested without
// a database.
//
// Statements returned by a Dialect take their values as parameters; the only
// values ever written into SQL text are identifiers (quoted by the dialect),
// integers, and dates the middleware formats itself (partition bounds, see
// Partitioner).
type Dialect interface {
	// Name is the dialect's short name, such as "postgres".
	Name() string

	// MaxKeyBytes is the longest message key, in bytes, that the claim table
	// can index. Longer keys are rejected before anything is sent.
	MaxKeyBytes() int

	// SchemaSQL returns the statements that create the claim table and its
	// processed_at index if they do not exist. They are run in order, in one
	// transaction, and must be harmless to run again. A dialect that is a
	// [SchemaInspector] has EnsureSchema create only what its catalog says
	// is missing instead; SchemaSQL is then the DDL a migration runs.
	SchemaSQL(t Table) []string

	// ClaimSQL returns the statement that inserts the claim (consumer, key)
	// for parameters 1 and 2 and affects exactly one row when it inserted,
	// zero rows when the claim already existed. It must never fail on a
	// duplicate: a unique violation aborts a Postgres transaction.
	ClaimSQL(t Table) string

	// LockTimeoutSQL returns a statement, run inside the transaction before
	// the claim, that bounds how long the claim waits behind a duplicate held
	// by another transaction. It returns "" when the dialect cannot bound the
	// wait.
	LockTimeoutSQL(d time.Duration) string

	// TxIDSQL returns a query that yields one value identifying the current
	// database transaction, or "" when the dialect cannot tell. The middleware
	// reads it after the claim and again before commit to prove the session
	// never left the claim's transaction.
	TxIDSQL() string

	// Classify tells what kind of failure err is. It is called with errors
	// from the driver, possibly wrapped, and must find them with errors.As.
	Classify(err error) Class
}

// Kind is a class of database failure that the middleware treats alike
// across dialects.
type Kind int

const (
	// KindOther is any failure not listed below: it is returned to the
	// caller as it is.
	KindOther Kind = iota
	// KindSerialization is a serialization failure or a deadlock: the
	// transaction was rolled back and running it again may succeed.
	KindSerialization
	// KindConnection is a lost connection or a server shutting down. The
	// transaction is gone; if it was lost during COMMIT it may or may not
	// have committed. The claim makes running it again safe either way.
	KindConnection
	// KindLockTimeout is a lock wait that ran out of the time set by
	// LockTimeoutSQL.
	KindLockTimeout
	// KindUndefinedTable says the claim table does not exist.
	KindUndefinedTable
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindOther:
		return "other"
	case KindSerialization:
		return "serialization"
	case KindConnection:
		return "connection"
	case KindLockTimeout:
		return "lock_timeout"
	case KindUndefinedTable:
		return "undefined_table"
	}
	return "unknown"
}

// Class is the result of [Dialect.Classify]: the kind of failure and the
// database's own code for it (an SQLSTATE where the database has one).
type Class struct {
	Kind Kind
	// Code is the database's error code, such as "40001"; "" when the error
	// carried none (a closed socket, for example).
	Code string
}

// Retryable reports whether a transaction that failed this way may be run
// again from the start.
func (c Class) Retryable() bool {
	return c.Kind == KindSerialization || c.Kind == KindConnection
}
