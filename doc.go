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
//     connections are retried from the start under a [RetryPolicy]; a lost
//     COMMIT is safe to retry because the claim makes the re-run a
//     duplicate if the commit landed.
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
//     older than the retention window ([ErrBeyondRetention]).
//   - [Middleware.ProcessBatch] and [WrapBatch] claim a batch of messages in
//     one statement and commit once.
//   - [Middleware.ProcessNatural] and [NewVersionedUpsert] cover effects whose
//     own table has a natural key, or that replace state by version.
//
// Subpackages: postgres, mysql and sqlite are the dialects (and
// dialect/dialecttest their conformance suite); mocks scripts the
// middleware's statements on go-sqlmock for unit tests; idemsqlx runs
// handlers written against sqlx (see [ProcessTx] for other libraries that
// wrap *sql.Tx); rabbitmq is a consumer with late acks; outbox carries calls
// that leave the database; otelmetrics reports metrics and traces to
// OpenTelemetry; migrations holds the schema as goose and golang-migrate
// files.
//
// The package imports only the standard library and the dialect package. A
// [dialect.Dialect] supplies the SQL; github.com/txclaim/idempotent/postgres
// is the Postgres one.
package idempotent
