// Package idempgx is the idempotent middleware for applications built on
// pgx: handlers take a pgx.Tx (and so sqlc's pgx code, through
// Queries.WithTx), and claims are taken on a *pgxpool.Pool.
//
//	m, err := idempgx.New(pool, "loyalty")
//	…
//	msg := idempotent.Message{Key: "order-completed:9912"}
//	outcome, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
//		return queries.WithTx(tx).AddPoints(ctx, arg)
//	})
//
// The semantics are those of the core package's Middleware (see
// github.com/txclaim/idempotent): one transaction, a claim row inserted with
// INSERT … ON CONFLICT DO NOTHING, the handler only if the claim is new, claim
// and effect committed together; retries of serialization failures,
// deadlocks and lost connections under an idempotent.RetryPolicy, in the
// core's own loop (idempotent.RetryPolicy.Run); a lock timeout
// (idempotent.ErrClaimBusy), a claim's failures mapped by the core's
// idempotent.Config.ClaimError; messages with event times, the
// retention fence and daily partitions (ProcessMessage); batches in one
// statement, with the keys (and in partitioned mode their event days) as
// native []string arrays (ProcessMessages); the wrappers of decoded
// messages (WrapMessage, WrapMessages); an idempotent.Observer; and the
// duplicate pre-check (WithSeen, an idempotent.Seen). Errors are the core's values, so
// errors.Is(err, idempotent.ErrInvalidKey) and the rest work the same on
// both paths, and both paths share the claim table.
//
// What pgx makes possible:
//
//   - BEGIN (with the isolation level, and SET LOCAL lock_timeout when set)
//     and the claim travel in one round trip: prepared once per connection,
//     then written as one Bind/Execute/Sync sequence. A new message costs
//     that round trip, the handler's statements and COMMIT; a duplicate
//     costs that round trip and ROLLBACK. BEGIN comes first in the same
//     round trip, so a new message's claim never commits without its effect.
//     Connections configured not to prepare statements (the simple protocol,
//     or pgx.QueryExecModeExec behind a transaction-mode pooler) send the
//     same statements as one pgx.Batch, also one round trip.
//   - The claim table's retention horizon (how far back Cleanup and
//     MaintainPartitions have forgotten, recorded in the database) fences
//     every message with an event time as on the core's path, at no extra
//     round trip: the single claim is the statement that reads the horizon
//     and inserts only when the message is not older than it
//     (postgres.Dialect.HorizonClaimQuerySQL), in the same Bind/Execute/Sync; a
//     batch reads it in a statement queued after its claim, in the same
//     pipeline, so after the insert and in its transaction. A message older
//     than the horizon is refused with idempotent.ErrBeyondRetention (in a
//     batch, an *idempotent.BatchKeyError naming it) whatever this
//     Middleware's window, and a missing partition is ErrBeyondRetention
//     when its day was dropped, ErrNoPartition otherwise. A message without
//     an event time, which no horizon refuses, keeps the plain claim.
//   - Retries are decided by the claim's own connection: a handler's 40001
//     or 40P01 is retried only if it failed the claim's own transaction (the
//     connection reports the transaction failed), and a lost connection only
//     if it is the claim's own. Any other error of the handler, a 40001 it
//     got from a statement run elsewhere included, is returned at once, as
//     are context.Canceled and context.DeadlineExceeded.
//   - The handler's pgx.Tx refuses Commit and Rollback, and a COMMIT or
//     ROLLBACK statement run through it is found from the connection's
//     transaction status before commit; both fail the delivery with an error
//     matching idempotent.ErrAutocommit. Its Begin opens a savepoint.
//   - Nested work: ProcessMessage or ProcessMessages called with the
//     context a handler was given fails with ErrNested (which matches
//     idempotent.ErrAutocommit) before taking a connection: the inner call
//     would commit on another connection, outside the outer claim.
//   - Ordered per key (WithOrdering, the core's idempotent.WithOrdering on
//     the same tables, docs/ordering.md): a message with an ordering key
//     and sequence applies after its predecessor; one ahead is parked and
//     released in its predecessor's transaction through Ordering.Release;
//     SkipGap, Waiting and CheckGaps are this package's. The sequence's
//     advance travels with BEGIN and the claim, in one round trip.
//   - Coalesced transactions (WithCoalescing, the core's
//     idempotent.Coalescing with its contract): concurrent ProcessMessage
//     calls share one transaction on one connection, grouped by the core's
//     own machinery, in key order. Each message's claim is sent just before
//     its handler runs, never earlier — the first with BEGIN, in one round
//     trip, each later one in a round trip of its own — and each new
//     message's handler then runs on its caller's goroutine with a pgx.Tx
//     of its own on the group's connection; one COMMIT ends the group. A
//     group of n new messages whose handlers send h statements each costs
//     n·(1 + h) + 1 round trips in either design, where n separate calls
//     cost n·(h + 2); a duplicate costs its claim's round trip, a key given
//     twice in a group none for its second message.
//     By default (optimistic) BEGIN is followed by a statement that marks
//     the transaction with a token of its own and sets Coalescing.LockWait's
//     bound (the Postgres dialect's dialect.TxFencer), each claim fails,
//     inserting nothing, outside the transaction so marked, and the same
//     check goes in front of COMMIT, in COMMIT's round trip; a handler's
//     failure rolls the group back (the check rides with ROLLBACK) and the
//     group runs again without it. With Savepoints each message's claim and
//     handler run under a savepoint: its SAVEPOINT, and the RELEASE of the
//     previous message's, ride with its claim, the last RELEASE with COMMIT;
//     a failed handler costs one round trip (ROLLBACK TO and RELEASE, which
//     undo its claim with its effect) and no other handler runs again.
//     Whatever one handler does to the transaction fails its own message
//     alone and leaves every other one committed with its effect or not
//     claimed at all: an error, a panic, a refused Commit or Rollback, a
//     failed statement it swallowed (the connection reports the transaction
//     aborted, at no round trip), its context ending, and a COMMIT, END or
//     ROLLBACK statement through its pgx.Tx or its Conn (the connection
//     reports no transaction), even one followed by BEGIN in the same
//     simple-protocol string (the next claim's fence, or the RELEASE, then
//     fails, and so does the check before COMMIT, which the server then
//     skips). A handler that ended the transaction fails with an error
//     matching idempotent.ErrAutocommit, which says that its claim may have
//     committed with a part of its effect (a redelivery would then be a
//     duplicate); the messages after it were never claimed in that
//     transaction, and the group runs again without it: a message before it
//     whose claim and effect its COMMIT committed then comes back Duplicate.
//     A claim that fails for good (a lock wait past the group's bound, a
//     missing partition) sends its own message alone, and so does a
//     handler's lock wait past the bound; a COMMIT that fails for good (a
//     deferred constraint) sends every message alone, to its own outcome.
//   - Queued effects (Queue): a handler queues the statements whose
//     results it does not read, and the middleware sends them with its next
//     statement in the same round trip — alone with COMMIT, so claim,
//     effects and COMMIT cost two round trips; in a coalesced group with
//     the next message's claim, the last one's with COMMIT, so a group of n
//     messages whose handlers only queue costs n + 1. A statement the
//     handler runs at once sends what it queued first: its statements apply
//     in its order. A queued statement's failure is its message's alone, as
//     a handler's error is (with savepoints its claim is undone and the
//     group goes on; optimistic the group runs again without it), at no
//     round trip when nobody fails. WithQueuedOnly declares handlers that
//     only queue (a statement run at once is refused): an optimistic group
//     then runs its handlers first and sends BEGIN, every claim, every
//     queued statement and COMMIT in one round trip (four when it meets a
//     duplicate or a failed statement).
//
// Schema upkeep is the core's: EnsureSchema delegates to it, and Core
// returns the database/sql Middleware for the same table on the same pool
// (through pgx's stdlib adapter), whose ClaimTable runs Cleanup and
// MaintainPartitions (or build one with idempotent.NewClaimTable).
//
// The measurements are in the repository's BENCHMARKS.md ("The pgx path");
// docs/pgx.md describes the package and how they were made.
package idempgx
