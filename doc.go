// Package idempotent makes a message consumer's database side effects happen
// exactly once, however many times and however concurrently a broker
// delivers the message.
//
// Brokers deliver at least once: after a consumer crash, a dropped
// connection or a dead-letter replay, the same message arrives again, and two
// copies may arrive at the same moment. A check-then-act guard ("was this
// order credited?") lets two concurrent copies both pass. This package claims
// each message with a row in a unique index, in the same transaction as the
// effect, so the effect commits once: the idempotent-consumer pattern of the
// guide "Idempotent Consumers with Postgres Unique Constraints".
//
// # Processing a delivery
//
// [New] returns a [Middleware] for one consumer on one database, given a
// [dialect.Dialect] (github.com/txclaim/idempotent/postgres for Postgres).
// [Middleware.EnsureSchema] creates the claim table, processed_messages by
// default ([WithTable] names another), or run the migration from package
// migrations. [Middleware.ProcessMessage] then runs one delivery:
//
//	mw, err := idempotent.New(db, postgres.New(), "loyalty")
//	…
//	msg := idempotent.Message{Key: "order-completed:9912", EventTime: occurredAt}
//	outcome, err := mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", 50, 7)
//		return err
//	})
//
// For each delivery ProcessMessage begins a transaction, inserts the claim
// (consumer, message key) with INSERT … ON CONFLICT DO NOTHING, and:
//
//   - if the claim was inserted, runs the function on the same *sql.Tx and
//     commits claim and effect together: [Applied];
//   - if the claim existed, rolls back without running the function:
//     [Duplicate];
//   - if another transaction holds the same claim, waits for it on the unique
//     index: when it commits this delivery is a Duplicate, when it rolls back
//     this one applies the effect itself.
//
// An error from the function rolls back claim and effect together and is
// returned wrapped; a panic rolls back, releases the connection and
// re-panics. Several consumers may share one claim table: a claim is keyed by
// consumer and message key.
//
// # Acknowledging
//
// Ack the message only after ProcessMessage returns a nil error, for Applied and
// Duplicate alike: a duplicate's effect has already committed. On an error
// do not ack; the claim rolled back with the effect and the redelivery
// applies normally. Errors matching [ErrInvalidKey], [ErrInvalidEventTime] or
// [ErrBeyondRetention] fail the same way on every redelivery: dead-letter
// those. [ErrClaimBusy] and [ErrNoPartition] mean deliver again later.
//
// # Keys
//
// The key is the message's stable identity, assigned by the producer: an
// event id, or a natural business key such as "order-completed:9912". It
// must be the same on every redelivery, republish and replay, so never a
// broker's delivery tag or a message id that a relay or replay tool
// reassigns. A key is non-empty valid UTF-8 without NUL, at most the
// dialect's MaxKeyBytes (1,024 bytes for every shipped dialect); anything
// else is refused with ErrInvalidKey before a connection is taken.
//
// Where the producer's event id is yours to choose, prefer a time-ordered
// one (UUIDv7, ULID, a prefixed sequence): a random key such as a UUIDv4
// lands on a random page of the claim table's index, which costs
// throughput in a plain table of millions of claims, most for batches, and
// about nothing in partitioned mode (WithDailyPartitions). The figures are
// in the repository's BENCHMARKS.md (claim table growth per key shape);
// docs/performance.md says how they were measured and how to read them.
//
// # Entry points
//
// Every entry point takes a [Message]: the key and, when the producer
// stamped one, the event time (zero means unknown). Event time, partitioned
// mode, batches and caller-owned transactions therefore combine freely. One
// message or many, in the middleware's *sql.Tx or in a transaction type of
// the caller's library, each with a wrapper for decoded messages; the
// arguments always come in one order: ctx, the Middleware, the message (or
// messages), the begin function, the function.
//
//	transaction             one message                   a batch
//	middleware's *sql.Tx    Middleware.ProcessMessage     Middleware.ProcessMessages
//	                        WrapMessage                   WrapMessages
//	a BeginFunc's T         ProcessMessageTx              ProcessMessagesTx
//	                        WrapMessageTx                 WrapMessagesTx
//
// In turn:
//
//   - [Middleware.ProcessMessage] runs one delivery with a [TxFunc].
//   - [WrapMessage] turns a [Handler] of decoded messages into a function
//     that takes the Message from the message (a failing function is
//     ErrInvalidKey, with no transaction opened).
//   - [Middleware.ProcessMessages] and [WrapMessages] process a batch in one
//     transaction (see Batches below).
//   - [ProcessMessageTx], [ProcessMessagesTx], [WrapMessageTx] and
//     [WrapMessagesTx] begin each attempt's transaction through a
//     [BeginFunc], for libraries that wrap *sql.Tx in their own type
//     (package idemsqlx is sqlx's).
//   - [Middleware.ClaimMessage] inserts the claim in a transaction the
//     caller owns and reports whether it was new; the caller applies the
//     effect only if so, and commits. Retries are then the caller's:
//     [RunTx] runs a function in a transaction under the same retry loop,
//     without a claim.
//   - [Middleware.ProcessNatural] runs the loop without a claim table, for
//     effects whose own table has a natural unique key (see below).
//
// A message's event time enables the retention fence and, in partitioned
// mode, where it is required, chooses the claim's partition (see Retention
// below).
//
// There is no form that takes a bare key. Message{Key: key} is a message
// without an event time, as short to write as a key, and the key-only forms
// it would save were exactly the calls the retention fence can never cover:
// a consumer that has the producer's event time should not be offered a
// signature with no room for it. One form per cell also keeps the grid above
// without holes.
//
// [Middleware.Config] reports what the Middleware was configured with
// ([Config]), for adapters and test helpers that must send or expect what it
// sends.
//
// # Retries
//
// The whole transaction, claim and function, is run again when the claim's
// own transaction suffered a serialization failure (Postgres 40001), a
// deadlock (40P01) or the loss of its connection (class 08, 57P01–57P03, 25006,
// driver.ErrBadConn, a network error, a failover's standby) — see "What is retried" below for
// what a handler meets elsewhere —, with exponential backoff and jitter,
// sleeping with no transaction open and giving up when the context ends.
// [RetryPolicy] sets the limits ([DefaultRetryPolicy]: 10 attempts, 5 ms
// doubling to 1 s; [WithRetry] replaces it). After the last attempt the error
// matches [ErrRetriesExhausted] and, as a [RetriesExhaustedError], wraps the
// last cause. Errors are classified through errors.As on the driver's error
// (interface{ SQLState() string }), so lib/pq and pgx's database/sql driver
// both work; message text is read only where the code alone is ambiguous
// or missing (a standby's 0A000 refusal of BEGIN READ WRITE, a multi-host
// connection string finding no writable host: see postgres.Dialect.Classify). A lock timeout (55P03) becomes
// ErrClaimBusy, a missing claim table (42P01) [ErrNoClaimTable], and an
// unknown statement outcome (40003) is returned as it is; anything else is
// returned wrapped, errors.Is and errors.As still see it, and it is not
// retried.
//
// There is one retry loop, [RetryPolicy.Run], and one mapping of a claim's
// failure, [Config.ClaimError]; the pgx path (package idempgx) runs its
// pipelined attempts in the same loop and maps its claims' errors the same
// way, so the two cannot drift.
//
// A connection lost during COMMIT is ambiguous for ordinary code — the
// commit may or may not have landed — but safe to retry here: the retry
// either finds the claim (the commit landed: Duplicate) or inserts it (it
// did not: Applied, once).
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
// down, say — returns its error: ProcessMessage rolls back and returns it, the
// message is not acked, and the broker adapter requeues it (with its own
// delay), which is the retry for failures outside the transaction.
//
// # Work inside a handler
//
// A handler does its database work through the *sql.Tx it is given, with
// the context it is given. A transaction begun with that context — RunTx,
// ProcessMessage, ProcessMessages, ProcessNatural, ProcessMessageTx or
// ProcessMessagesTx of any Middleware, the Wrap functions, EnsureSchema,
// Cleanup, MaintainPartitions — is refused at once with an error matching [ErrAutocommit], before it
// takes a connection, and the delivery rolls back even if the handler
// ignores that error: such a transaction would commit on its own and
// survive the delivery's rollback (or, with the same Middleware and key,
// wait on its own claim). A context derived from the handler's is refused
// too, context.WithoutCancel(ctx) included, since it keeps the handler's
// values.
//
// Work that must stand on its own runs on a context that does not derive
// from the handler's: context.Background() with a timeout of its own, or a
// context made before ProcessMessage was called. It is then not exactly-once with
// the message: it commits apart from the claim, once per attempt and per
// delivery, and stays when the delivery rolls back. Give it its own
// idempotency — a ProcessMessage of another Middleware with the same key, or a
// natural key — if it must not repeat.
//
// # The autocommit guard
//
// If claim and effect commit separately, a crash between them loses the
// effect. The classic way to get there is db.ExecContext(ctx, …) in the
// function instead of tx.ExecContext(ctx, …). Open the database through
// [GuardConnector] (or [OpenGuarded]) and that mistake cannot commit: a
// statement run with the function's context on any connection but the
// claim's transaction fails with [ErrAutocommit] before it reaches the
// database, and the whole transaction rolls back even if the function
// ignores the error. So does db.BeginTx with that context, and a
// transaction-control statement (COMMIT, ROLLBACK, BEGIN, …) leading a
// string run through the tx. The guard also wraps the claim's transaction:
// only the middleware commits or rolls it back, so a function's own
// tx.Commit() or tx.Rollback() rolls it back, fails with ErrAutocommit, and
// nothing of that attempt — claim or effect — commits. On MySQL and
// MariaDB, a statement the database would commit implicitly (DDL, LOCK
// TABLES, …: dialect.ImplicitCommitter) is refused the same way; and after
// a statement fails with an error for which InnoDB rolled the whole
// transaction back (a deadlock: dialect.ImplicitRollbacker), every further
// statement of the function is refused, since it would commit on its own,
// and a function that swallowed the error and returned nil fails with
// ErrAutocommit instead of being reported applied with nothing committed.
// [WithStrictGuard] also reads the database's transaction id after the claim
// and before COMMIT and refuses to commit if the session left the
// transaction (which the guard cannot see in a multi-statement string, or
// behind a pooler), at the price of two round trips per applied message; when
// the function fails it reads it once more, and says so loudly if the claim
// had already been committed with part of the effect. Statements outside a
// function are untouched; a function that uses context.Background() on the
// *sql.DB cannot be caught. The repository's docs/dialects-edges.md lists
// every such edge and what the middleware does at each.
//
// # Lock timeout
//
// A duplicate waits behind the claim's holder for as long as the holder's
// transaction lasts. [WithLockTimeout] bounds the wait: past it the delivery
// fails with ErrClaimBusy and writes nothing. [WithTxOptions] sets the
// transaction's isolation level (under SERIALIZABLE, concurrent duplicates
// fail with 40001 instead of waiting, and the retry returns Duplicate); New
// refuses a level or option the dialect cannot run.
//
// # Retention
//
// A claim deduplicates only while it exists, and the claim table grows by a
// row per message, so claims are kept for a retention window ([WithRetention],
// [DefaultRetention] 30 days) and then removed. Choose the window longer than
// the longest dead-letter triage and replay you allow; for effects no window
// makes safe, keep a natural unique key on the business table as well.
//
// A message that carries its event time ([Message].EventTime) and is older
// than the window is refused with ErrBeyondRetention before any
// transaction: the retention fence. Claims are
// kept for the window plus a clock-skew margin ([WithClockSkew],
// [DefaultClockSkew]), so a message the fence lets through still finds its
// claim. An event time later than the clock plus the margin (a producer clock
// far ahead, seconds read as milliseconds) is refused with
// [ErrInvalidEventTime], since it would pass the fence long after its claim
// was gone. A message without an event time (a zero EventTime) cannot be
// fenced: a replay older than the window is
// applied again. [WithClock]
// replaces the clock the middleware reads, for tests.
//
// The window is this process's configuration; the claim table also records
// what it has forgotten, its retention horizon: every cleanup and partition
// drop raises it in the database before deleting, and a message older than
// the horizon is refused with ErrBeyondRetention too, read in the claim's
// own transaction (in the Postgres claim statement itself). So a window
// lengthened after a cleanup takes effect forward only, and processes with
// different windows on one table never re-apply what the shortest one's
// cleanup forgot ([ClaimTable.Horizons]; docs/operations.md has the
// argument).
//
// # Table upkeep
//
// A [ClaimTable] is the claim table apart from any consumer: schema, cleanup,
// partitions and statistics for the whole table, configured with the
// table's options, the [TableOption]s ([WithTable], [WithRetention],
// [WithClockSkew], [WithClock], [WithDailyPartitions], [WithRetry]), by
// [NewClaimTable], or taken from a Middleware with [Middleware.ClaimTable].
// Scheduled jobs and the command cmd/idempotent use it without naming a
// consumer. The options of a consumer's deliveries (WithTxOptions,
// WithLockTimeout, WithObserver, WithStrictGuard, WithSeen, WithCoalescing) are plain
// Options, which NewClaimTable does not take: handing it one does not
// compile.
//
// [ClaimTable.Cleanup] deletes the claims of every consumer older than the
// window plus the margin in short batches, each its own transaction under a
// statement timeout that halves the batch when it runs out
// ([CleanupOptions], [DefaultCleanupOptions]); one runner works on a table
// at a time, and a second gets [ErrCleanupBusy].
// [ClaimTable.CleanupConsumer] cleans one consumer's claims only, for a table
// shared by consumers with different windows. At high volume,
// [WithDailyPartitions] partitions the table by the UTC day of each
// message's event time (never the time of processing, so a redelivery the
// next day still meets its claim), and [ClaimTable.MaintainPartitions]
// creates days ahead and drops expired ones ([PartitionReport]); in that
// mode every delivery needs its event time, and one whose day, inside the
// window, has no partition yet fails with [ErrNoPartition], which is
// transient: deliver it again later. [ClaimTable.Partitions] lists the
// days; [ClaimTable.Stats] counts each consumer's claims ([ConsumerStats]).
// A Middleware's own upkeep goes through its table,
// mw.ClaimTable().MaintainPartitions(ctx) say; only [Middleware.EnsureSchema]
// is the Middleware's, since with WithStrictGuard it also checks that the
// server can run the guard's query. The command cmd/idempotent runs all of this from cron; docs/operations.md in
// the repository describes it.
//
// # Batches
//
// [Middleware.ProcessMessages] claims up to [MaxBatchSize] messages in one
// transaction — on an unpartitioned Postgres table in one statement
// (dialect.BatchClaimer) — runs the function once with the indexes of the
// new messages ([BatchFunc]; [WrapMessages] passes the messages,
// [BatchHandler]) and commits once; it returns one Outcome per message. A
// key repeated within the batch is applied once. Keys are claimed in
// ascending byte order, so overlapping batches wait for each other instead
// of deadlocking. If every message is a duplicate the function does not
// run. Event times work message by message: each passes the retention
// fence, and in partitioned mode each claim goes into its own day's
// partition. Bad input fails the whole batch before anything is sent:
// [ErrBatchTooLarge], or a [BatchKeyError] naming the index and matching
// ErrInvalidKey, ErrBeyondRetention or ErrInvalidEventTime — set that
// message aside and send the rest again. Retries re-run the whole batch;
// an [Observer] gets one [Event] per message.
//
// # Coalesced transactions
//
// Most handlers are written one message at a time and run from several
// workers. [WithCoalescing] lets such concurrent [Middleware.ProcessMessage]
// calls share one transaction: those arriving within [Coalescing].Wait of
// the first, up to Coalescing.Max, run in key order, each claimed just
// before its handler runs — on its own caller's goroutine, with its own
// context, so the *sql.Tx is never used concurrently and a panic stays its
// caller's — and one COMMIT ends them; each call returns its own outcome
// after that COMMIT. A handler's failure fails its own message: by default
// the group is rolled back and runs again without it (the others' handlers
// run again; nothing of theirs had committed), or with
// Coalescing.Savepoints it rolls back to a savepoint of its own. A handler
// cannot break its neighbours: before the next claim and before COMMIT the
// middleware proves the transaction is still the group's (a fence on
// Postgres, the member's savepoint elsewhere), so a handler that commits,
// rolls back or breaks the transaction fails alone with [ErrAutocommit]
// and the others run again; [WithCoalescing] lists every such mistake and
// what it costs. docs/performance.md says when coalescing pays and what it
// costs.
//
// # Natural keys and versioned upserts
//
// Where the effect's own table has a natural unique key (one ledger row per
// order), [Middleware.ProcessNatural] runs a [NaturalFunc] with the
// transaction, retries and observer but no claim table; the function reports
// whether its INSERT … ON CONFLICT DO NOTHING took effect. For
// last-writer-wins state, dialect.NewVersionedUpsert builds a dialect.Upsert
// that writes a row only if its version is newer than the stored one, so
// repeated and out-of-order messages are harmless.
//
// # Observing
//
// [WithObserver] passes every outcome ([Event]: consumer, key, outcome,
// attempts, duration, error) and every retry ([RetryEvent]: attempt,
// reason, SQLSTATE, backoff) to an [Observer]. [Counts] counts them in
// memory; its Duplicates figure is the real redelivery rate of the broker
// and consumer. An Observer that also implements [Starter] is called before
// the first attempt of each delivery, and the context it returns is the one
// the attempts, the handler and the Observer's calls get: package
// otelmetrics records OpenTelemetry metrics and, with that hook, one span per
// delivery under which the handler's own spans nest. One that implements
// [GroupStarter] is also called before each transaction of a coalesced
// group ([WithCoalescing]), with the group's members: otelmetrics records
// one span per such transaction, linked to each member's delivery.
//
// # Bad input
//
// Nothing is written, and the error names the problem: a bad key is
// ErrInvalidKey; a consumer name outside 1–[MaxConsumerBytes] bytes of ASCII
// letters, digits and . _ - : / is [ErrInvalidConsumer] from New; a table
// name that is not table or schema.table of lower-case letters, digits and
// _ (at most 63 bytes a part) matches dialect.ErrInvalidIdentifier
// (upper-case letters are refused because Postgres folds an unquoted name
// to lower case: see dialect.Table); a bad option is an error from New. A
// missing claim table is [ErrNoClaimTable]. [Middleware.EnsureSchema]
// sends no DDL when the schema is complete, and DDL it needs gives up
// waiting behind an open claim with [ErrSchemaLockTimeout].
//
// # Testing
//
// Package mocks scripts the middleware's own statements on go-sqlmock, with
// SQL text taken from the dialect, so a unit test scripts only its
// function's statements; this package's examples run on it. The
// dialect/dialecttest suite checks a dialect against its real database.
//
// # Packages
//
// This package imports only the standard library and package dialect.
// Around it: postgres, mysql and sqlite are the dialects; mocks is for unit
// tests; idemsqlx runs sqlx handlers; migrations holds the claim table as
// goose and golang-migrate files; outbox carries calls that leave the
// database; otelmetrics reports metrics and traces to OpenTelemetry; rabbitmq is a consumer that
// acks late; cmd/idempotent is the ops command. The integrations that bring
// a driver or client of their own (mysql, sqlite, idemsqlx, otelmetrics,
// rabbitmq) are Go modules of their own, so importing this package and
// postgres builds only lib/pq. The repository's README and
// docs/ directory cover guarantees and how they are tested, operations,
// dialects, the outbox and performance; its BENCHMARKS.md holds the
// measured figures.
package idempotent
