package dialect

import "time"

// TxFencer is implemented by dialects whose claim statement can prove that
// it runs in the transaction it was meant for. A coalesced group
// (idempotent.WithCoalescing) claims each of its messages just before that
// message's handler runs, in the transaction the handlers before it ran in;
// a handler that ended that transaction — its own COMMIT or ROLLBACK, a
// Commit on the *sql.Tx — or made the database abort it (an error it
// swallowed) must not let the next claim run on its own and commit by
// itself. A fenced claim fails instead, inserting nothing, and the
// middleware knows the handler before it broke the group's transaction.
//
// The fence is a token the middleware makes for each transaction of a
// group and marks the transaction with (TxFenceSQL); the mark lasts until
// the transaction ends, by COMMIT or ROLLBACK alike. A dialect without a
// TxFencer fences each message of a group with a savepoint instead
// (MessageSavepointSQL before its claim, MessageReleaseSQL after its
// handler), whose release fails once the transaction it was taken in is
// gone.
type TxFencer interface {
	// TxFenceSQL returns one statement, run in a group's transaction
	// before its first handler (after the claims that precede it, which
	// need no fence), that marks the transaction with parameter 1, the
	// token (a string), until it ends; when lockWait is positive it also
	// bounds the transaction's lock waits, as LockTimeoutSQL(lockWait)
	// would.
	TxFenceSQL(lockWait time.Duration) string
	// TxFencedClaimSQL returns the claim statement the middleware runs
	// otherwise — ClaimSQL, the Partitioner's ClaimAtSQL when partitioned,
	// the HorizonClaimer's HorizonClaimSQL when horizon — with the token
	// as one more parameter after all of that statement's: it inserts
	// nothing and fails, with an error for which TxFenceBroken holds,
	// unless it runs in the transaction TxFenceSQL marked with that token.
	// Otherwise it behaves, and reports rows affected, as that statement
	// does.
	TxFencedClaimSQL(t Table, partitioned, horizon bool) string
	// TxFenceCheckSQL returns a statement taking the token as parameter 1
	// that fails the same way unless it runs in the transaction marked with
	// it, and otherwise does nothing: the check after a group's last
	// handler, before its COMMIT.
	TxFenceCheckSQL() string
	// TxFenceBroken reports whether err, the failure of one of the
	// statements above, says that the statement did not run in the marked
	// transaction: the fence failed, or the transaction was aborted (a
	// statement before it failed) or had ended. It is asked about those
	// statements' failures only.
	TxFenceBroken(err error) bool
}
