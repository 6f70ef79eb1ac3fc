package dialect

// The statements the middleware runs on the claim's transaction after the
// handler failed with an error that Classify calls retryable (a
// serialization failure, a deadlock or a lost connection), to learn whether
// the transaction itself suffered that failure or the handler met it
// elsewhere — on another database, another connection, or its own network
// call. They are standard SQL, which Postgres, MySQL, MariaDB and SQLite run
// alike, so no dialect supplies them:
//
//   - both succeed: the transaction is alive and still open, so the failure
//     was not its own, and the handler's error is returned without a retry;
//   - one fails with an error Classify calls KindConnection (or
//     driver.ErrBadConn): the connection is gone, and the transaction with it;
//   - one fails otherwise: the database aborted the transaction. Postgres
//     refuses every statement of an aborted transaction (SQLSTATE 25P02);
//     InnoDB rolls a deadlocked transaction back, after which the savepoint
//     is not kept and its release fails (error 1305).
//
// The savepoint is released again at once; the middleware rolls the
// transaction back afterwards in any case.
const (
	ProbeSavepointSQL = "SAVEPOINT idempotent_probe"
	ProbeReleaseSQL   = "RELEASE SAVEPOINT idempotent_probe"
)

// The statements around each handler of a coalesced group with savepoints
// (idempotent.Coalescing.Savepoints): a savepoint before the handler,
// released after it succeeded, rolled back to after it failed, so that the
// failure undoes that message's work alone and the group goes on. Standard
// SQL, which every dialect's database runs alike.
const (
	MessageSavepointSQL = "SAVEPOINT idempotent_message"
	MessageReleaseSQL   = "RELEASE SAVEPOINT idempotent_message"
	MessageRollbackSQL  = "ROLLBACK TO SAVEPOINT idempotent_message"
)

// StatementJoiner is implemented by dialects whose database/sql drivers run
// several statements without parameters, sent as one, in one round trip,
// in order, stopping at the first that fails (Postgres, whose drivers send
// a statement without arguments in the simple query protocol). A coalesced
// group with savepoints sends the release of a message's savepoint and the
// next message's savepoint as one statement (and its lock wait bound with
// its first savepoint), saving a round trip per message.
type StatementJoiner interface {
	// JoinSQL returns stmts, none of which takes parameters, as one
	// statement that runs them in order and fails with the first of them
	// that fails, the rest not run.
	JoinSQL(stmts ...string) string
}
