// Package idempotent makes a message consumer's database side effects happen
// exactly once, however many times a broker delivers the message.
//
// For each delivery, [Middleware.Process] opens one transaction, inserts a
// claim row (consumer, message key) with INSERT … ON CONFLICT DO NOTHING,
// runs the handler only if the claim inserted, and commits claim and effect
// together. The unique index on the claim table serialises concurrent
// duplicates: the second waits for the first and then sees its claim, or, if
// the first rolled back, applies the effect itself. Ack the message after
// Process returns, for [Applied] and [Duplicate] alike.
//
// Around that core:
//
//   - Serialization failures (SQLSTATE 40001), deadlocks (40P01) and lost
//     connections of the claim's own transaction are retried from the start
//     under a [RetryPolicy]; a lost COMMIT is safe to retry because the
//     claim makes the re-run a duplicate if the commit landed. What the
//     handler meets elsewhere is returned (see "What is retried" below).
//   - [GuardConnector] makes a handler's statement that escapes the claim's
//     transaction fail with [ErrAutocommit] instead of committing on its own,
//     and [WithStrictGuard] checks before commit that the session never left
//     the transaction.
//   - [WithLockTimeout] bounds the wait behind an in-flight duplicate
//     ([ErrClaimBusy]).
//   - An [Observer] receives every outcome and retry; [Counts] counts them.
//   - [WithRetention], [Middleware.Cleanup] and [WithDailyPartitions] with
//     [Middleware.MaintainPartitions] keep the claim table bounded without
//     weakening the guarantee; [Middleware.ProcessEvent] fences off messages
//     older than the retention window ([ErrBeyondRetention]) and dated in
//     the future ([ErrInvalidEventTime]); in partitioned mode a day whose
//     partition is not there yet is [ErrNoPartition], which is transient.
//   - [Middleware.ProcessBatch] and [WrapBatch] claim a batch of messages in
//     one statement and commit once.
//   - [Middleware.ProcessNatural] and [NewVersionedUpsert] cover effects whose
//     own table has a natural key, or that replace state by version.
//
// # What is retried
//
// The middleware retries a failure only when the claim's own transaction
// suffered it; everything else is returned at once, wrapped (errors.Is and
// errors.As see the cause), and the transaction is rolled back:
//
//	failure                                    where                           retried
//
//	serialization failure, deadlock            BEGIN, the claim, COMMIT,       yes
//	(Postgres 40001, 40P01; MySQL 1213,        the strict guard's reads
//	MariaDB 1020; SQLITE_BUSY, SQLITE_LOCKED)  a handler's statement on the    yes
//	                                           tx, which the database aborted
//	                                           met by the handler elsewhere:   no
//	                                           another database or connection
//
//	lost connection (driver.ErrBadConn, EOF,   BEGIN, the claim, COMMIT (a     yes
//	network errors, Postgres class 08 and      landed COMMIT makes the retry
//	57P01-03, pgx's SafeToRetry errors,        a Duplicate)
//	MySQL 2006, 2013, 1927, ...)               returned by the handler, the    yes
//	                                           claim's connection is gone
//	                                           returned by the handler, the    no
//	                                           claim's connection is alive
//	                                           (its own HTTP or RPC call)
//
//	anything matching context.Canceled or      anywhere, the handler's own     never
//	context.DeadlineExceeded                   query deadline included
//
//	lock timeout (ErrClaimBusy at the claim;   anywhere                        no
//	55P03, 1205 in the handler)
//	ErrAutocommit, ErrInvalidKey, constraint   anywhere                        no
//	violations, 40003, other handler errors
//	a panic in the handler                     rolled back, re-panicked        no
//
// To tell the handler's failures apart, the middleware asks the transaction
// after the handler returned an error the dialect classifies as retryable:
// it runs SAVEPOINT and RELEASE SAVEPOINT on it ([dialect.ProbeSavepointSQL]).
// A connection that fails them is gone; a transaction that fails them
// otherwise was aborted by the database (Postgres refuses every statement
// of an aborted transaction; InnoDB rolls a deadlocked transaction back, so
// its savepoint is not kept); a transaction that runs both is alive, and
// the failure was the handler's own. This works with any driver, with and
// without [GuardConnector]. With SQLite opened by sqlite.Open, the claim's
// transaction holds the write lock, so a SQLITE_BUSY in the handler comes
// from elsewhere and is returned.
//
// A handler that wants its message delivered again — an outside service is
// down, say — returns its error: Process rolls back and returns it, the
// message is not acked, and the broker adapter requeues it (with its own
// delay), which is the retry for failures outside the transaction.
//
// # Work inside a handler
//
// A handler does its database work through the *sql.Tx it is given, with
// the context it is given. A transaction begun with that context — RunTx,
// Process, ProcessEvent, ProcessBatch, ProcessNatural or ProcessTx of any
// Middleware, the Wrap functions, EnsureSchema, Cleanup, MaintainPartitions
// — is refused at once with an error matching [ErrAutocommit], before it
// takes a connection, and the delivery rolls back even if the handler
// ignores that error: such a transaction would commit on its own and
// survive the delivery's rollback (or, with the same Middleware and key,
// wait on its own claim). A context derived from the handler's is refused
// too, context.WithoutCancel(ctx) included, since it keeps the handler's
// values.
//
// Work that must stand on its own runs on a context that does not derive
// from the handler's: context.Background() with a timeout of its own, or a
// context made before Process was called. It is then not exactly-once with
// the message: it commits apart from the claim, once per attempt and per
// delivery, and stays when the delivery rolls back. Give it its own
// idempotency — a Process of another Middleware with the same key, or a
// natural key — if it must not repeat.
//
// Subpackages: postgres, mysql and sqlite are the dialects (and
// dialect/dialecttest their conformance suite); mocks scripts the
// middleware's statements on go-sqlmock for unit tests; idemsqlx runs
// handlers written against sqlx (see [ProcessTx] for other libraries that
// wrap *sql.Tx); rabbitmq is a consumer with late acks; outbox carries calls
// that leave the database; otelmetrics reports to OpenTelemetry; migrations
// holds the schema as goose and golang-migrate files.
//
// The package imports only the standard library and the dialect package. A
// [dialect.Dialect] supplies the SQL; github.com/txclaim/idempotent/postgres
// is the Postgres one.
package idempotent
