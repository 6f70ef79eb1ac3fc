// Package dialect defines the small interface through which the idempotent
// middleware talks to one kind of database: the SQL text of the claim table,
// the claim statement, the lock timeout and the transaction check, and the
// classification of the database's errors.
//
// A Dialect only returns SQL text and classifications; the middleware runs
// the statements. That split makes every statement golden-testable without a
// database. Implementations live in their own packages —
// github.com/txclaim/idempotent/postgres, …/mysql and …/sqlite — so that this
// package, like the middleware, imports only the standard library.
//
// # Classifying errors
//
// [Dialect.Classify] maps a database error to a [Class]: its [Kind]
// (serialization failure or deadlock, lost connection, lock timeout, missing
// table, or other) and its SQLSTATE or code. The middleware retries the first
// two, turns a lock timeout into idempotent.ErrClaimBusy and a missing table
// into idempotent.ErrNoClaimTable, and returns the rest. A dialect finds the
// driver's error with errors.As and classifies it by its code; it reads
// message text only where the code alone is ambiguous or there is none (the
// postgres dialect's standby refusals during a failover).
//
// # Optional abilities
//
// A dialect implements more by implementing small optional interfaces, which
// the middleware finds by type assertion:
//
//   - [BatchClaimer]: claim a whole batch in one statement (otherwise one
//     claim statement per key, in the same transaction);
//   - [LockTimeoutResetter]: restore a session-wide lock timeout after the
//     claim (MySQL's innodb_lock_wait_timeout);
//   - [ServerChecker]: check in EnsureSchema that the database is the one the
//     dialect speaks to, failing with [ErrWrongDatabase] before any DDL;
//   - [SchemaInspector]: tell from the catalog which of the claim table's
//     objects ([SchemaObject]) exist, so that EnsureSchema sends DDL only
//     for what is missing, under a lock timeout (otherwise SchemaSQL runs on
//     every EnsureSchema);
//   - [Cleaner]: batched cleanup of expired claims under a table lock;
//   - [Partitioner]: daily partitions keyed on the event day;
//   - [StatsReader]: claims per consumer, for idempotent.ClaimTable.Stats;
//   - [Upserter]: the version-guarded upsert of [NewVersionedUpsert];
//   - [ImplicitCommitter]: the statements the database commits implicitly
//     (MySQL's DDL, LOCK TABLES, …), which the guard refuses inside a
//     handler;
//   - [TxOptionsChecker]: the isolation levels and options the database
//     cannot run, which idempotent.New refuses;
//   - [ClaimFolder]: run the claim and another data-modifying statement of
//     the same transaction as one statement (the Kafka consumer's offset
//     advance; otherwise two statements);
//   - [Identifier]: name the claim table's database, which the duplicate
//     pre-check (idempotent.Seen) scopes its entries by.
//
// Without one, the middleware refuses the ability with an error that names
// the dialect ("the sqlite dialect does not support partitions").
//
// # Versioned upserts
//
// [NewVersionedUpsert] builds, for a dialect that is an [Upserter], a
// version-guarded upsert ([Upsert]): it writes a row only if its version is
// newer than the stored one, so repeated and out-of-order messages of
// last-writer-wins state are harmless without a claim. A handler runs it
// through its transaction ([Execer]) and can return its result from
// idempotent's ProcessNatural.
//
// # Identifiers
//
// Table names are parsed by [ParseTable] (table or schema.table, each part
// lower-case letters, digits and _, not starting with a digit, at most 63
// bytes) before any dialect sees them, so a dialect only has to quote them;
// a bad name matches [ErrInvalidIdentifier]. Upper-case letters are refused
// in every dialect: Postgres folds an unquoted name to lower case, MySQL
// folds it or not depending on the server, and a quoted mixed-case name
// would miss a table created by hand (see [Table]).
//
// # Conformance
//
// Package dialecttest is the suite every dialect passes against its real
// database, checking each optional interface where a dialect has it; a new dialect's test hands it a harness (the SQLite dialect's
// sqlite/conformance_test.go is a complete one).
package dialect
