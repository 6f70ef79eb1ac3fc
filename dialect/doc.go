// Package dialect defines the small interface through which the idempotent
// middleware talks to one kind of database: the SQL text of the claim table,
// the claim statement, the lock timeout and the transaction check, and the
// classification of the database's errors.
//
// A Dialect only returns SQL text and classifications; the middleware runs
// the statements. Implementations live in their own packages (the Postgres
// one is github.com/txclaim/idempotent/postgres) so that this package, like
// the middleware, imports only the standard library.
//
// Beyond [Dialect], a dialect implements the optional interfaces its
// database supports; the middleware finds them with a type assertion:
// [ServerChecker] (EnsureSchema checks the server), [LockTimeoutResetter]
// (a session-scoped lock timeout restored after the claim), [BatchClaimer]
// (one statement per batch), [Cleaner] (Cleanup), [Partitioner] (daily
// partitions), [Upserter] (version-guarded upserts), [ImplicitCommitter]
// (statements the database commits implicitly, refused by the guard) and
// [TxOptionsChecker] (isolation levels New refuses). The conformance suite,
// package dialecttest, checks each where a dialect has it.
//
// Identifiers such as table names are parsed by [ParseTable] before any
// dialect sees them, so a dialect only has to quote them.
package dialect
