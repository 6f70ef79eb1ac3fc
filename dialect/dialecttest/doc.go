// Package dialecttest is the conformance suite for implementations of
// dialect.Dialect: the checks every dialect must pass for the idempotent
// middleware to keep its promise on that database.
//
// A dialect's test hands [Run] a [Harness]: the dialect, a way to open the
// database under test, and a way to name a fresh claim table. The suite
// then runs, against the real database and through the real middleware:
//
//   - the schema: EnsureSchema twice, and concurrently, is harmless, and
//     with the schema complete it returns while a handler holds a claim
//     open;
//   - the claim: a key is applied once and then reported as a duplicate,
//     per consumer; keys compare byte for byte ("A" is not "a", "x" is not
//     "x "); a key of MaxKeyBytes bytes round-trips unchanged;
//   - concurrency: 8 and 32 concurrent deliveries of one key give exactly
//     one Applied and one effect; 32 distinct keys all apply;
//   - take-over: a delivery waiting behind a claim that is rolled back
//     applies the effect itself, and one waiting behind a commit is a
//     duplicate;
//   - real errors: a deadlock provoked between two deliveries (on databases
//     with row locks) is classified as a serialization failure and retried
//     to success; a killed session (where the harness can kill one) is
//     classified as a lost connection and retried; errors the harness
//     provokes are classified as it says;
//   - the lock timeout: mapped to ErrClaimBusy with nothing written, or, if
//     the dialect cannot bound a wait, refused by idempotent.New;
//   - the strict guard: catches a handler's own COMMIT, or, if the dialect
//     has no transaction id, is refused by idempotent.New;
//   - bad input: bad keys (empty, NUL, invalid UTF-8, longer than
//     MaxKeyBytes) and bad table names, upper-case letters included, are
//     rejected with nothing written;
//     a missing claim table is reported as ErrNoClaimTable;
//   - the batch claim: ProcessMessages applies each distinct new key once,
//     reports repeats and earlier claims as duplicates, rolls back whole,
//     and shares its claims with ProcessMessage;
//   - the lock timeout's scope: after a claim and after a batch claim with
//     WithLockTimeout, the session's lock timeout (Harness.LockTimeoutQuery)
//     is what it was before, and in the handler too where the dialect is a
//     dialect.LockTimeoutResetter;
//   - DDL in a handler: run through the claim's transaction and followed by
//     a failure, it leaves nothing committed and the redelivery applies
//     once — transactional DDL rolls back, and where the dialect is a
//     dialect.ImplicitCommitter the guard (Harness.OpenGuarded) refuses the
//     statement before it reaches the database;
//   - transaction options: New refuses ReadOnly and, where the dialect is a
//     dialect.TxOptionsChecker, each level it refuses, naming the level and
//     the dialect; every level it accepts runs a claim;
//   - the duplicate pre-check: two middlewares of one consumer name on two
//     tables sharing one SeenLRU each apply every message once;
//   - the optional interfaces, where the dialect implements them:
//     dialect.Cleaner (Cleanup deletes only claims past the window; run as
//     the middleware runs them, the batches delete exactly the claims
//     before the cutoff, of one consumer or of all, at most a batch at a
//     time, at a cutoff between milliseconds too, and record the horizon;
//     four runners at once delete every expired claim exactly once, a runner
//     that finds the lock held stopping at once, or, with SerialWriters,
//     waiting its turn up to the busy timeout; the lock answers false at once while another
//     transaction holds it, and is free again once the holder released it
//     and ended), dialect.StatsReader (claims per consumer, oldest and
//     newest as microseconds), dialect.HorizonKeeper (an advance never
//     lowers a row; a consumer reads the later of its row and the ""
//     row; HorizonsSQL lists the rows), dialect.Partitioner (a day's claim
//     applies once; a day without its partition yet is ErrNoPartition until
//     MaintainPartitions creates it, and the days past the window are
//     dropped with their claims),
//     dialect.Upserter (the version-guarded upsert) and dialect.ClaimFolder
//     (the claim folded with a companion statement reports the companion's
//     rows and whether the claim is new, and both commit), and
//     dialect.Identifier (the database is named alike from two pools, so
//     the pre-check runs and answers a redelivery).
//
// Every check feeds the dialect errors the database really produced; none
// is built by hand.
//
// # The matrix
//
// Run ends with the matrix ("Matrix"): every [Mode] of the Middleware —
// single (ProcessMessage), batch (ProcessMessages), coalesced
// (WithCoalescing, optimistic), savepoints (Coalescing.Savepoints), precheck
// (WithSeen), strict (WithStrictGuard), partitioned (WithDailyPartitions),
// and coalesced and savepoints each with precheck, strict and partitioned —
// on every column: database/sql opened with Harness.Open ("plain") and,
// when Harness.OpenGuarded is set, through idempotent.GuardConnector
// ("guarded"). A library whose handlers take a transaction type of its own
// runs the same rows with [Exercise] and a [Driver] of that type, which
// builds its Middleware from a [Config] and gives the matrix a [Deliverer]
// and the handler's actions on a transaction (package idempgx does, on
// pgx.Tx). A cell is "Matrix/<mode>/<column>/<scenario>", on tables of its
// own; Harness.Concurrent cells run at a time.
//
// A mode the dialect cannot run is one cell, "Refused", which checks that
// New refuses it naming the dialect (the strict guard without
// Dialect.TxIDSQL, the pre-check without dialect.Identifier, partitions
// without dialect.Partitioner); a coalesced row also checks that a positive
// Coalescing.LockWait is refused where the dialect's lock timeout outlives a
// transaction ("LockWaitRefused"). A mode a Driver has no option for is
// skipped with the reason it gives (Driver.Lacks). Nothing else is
// skipped but what the database cannot do: a deadlock with SerialWriters, a
// killed session without a way to kill one.
//
// The scenarios deliver their messages in rounds, all of a round at once:
// concurrent calls that share a group in the coalesced modes, one batch in
// the batch mode. The claim, retention and edge scenarios run in the modes
// whose path changes what they exercise: ClaimOnce (new, then duplicates —
// answered by the pre-check where there is one — and another consumer's),
// Duplicates (copies of two keys in one round), KeysByteExact,
// TakeOver/RolledBack and TakeOver/Committed (a round waiting behind a
// claim another transaction holds), LostSession (the round's session killed
// in a handler: retried), LockTimeout (ErrClaimBusy for the held key alone,
// or New refusing WithLockTimeout), Horizon (replays of claims a cleanup
// with a shorter window forgot are refused with ErrBeyondRetention beside
// new messages that apply), and in the partitioned modes MissingPartition
// (ErrNoPartition for the message of a day not created yet, alone).
//
// The handler mistakes ("Mistake/…") deliver five messages at once; the
// third's handler (in a batch, the batch function after its effects) makes
// the mistake on its first run: returns an error (Error), panics (Panic),
// swallows a failed statement (SwallowedError), is a real deadlock's victim
// and returns the error or swallows it (Deadlock/Returned,
// Deadlock/Swallowed), calls Commit or Rollback on its transaction, runs
// COMMIT, COMMIT as the second statement of a string (CommitInString) or
// ROLLBACK through it, writes through the pool with its context
// (PoolWrite), or sees its context cancelled (Cancelled). Each cell checks
// in the database that the culprit ended as the mistake must end it, given
// what the database did to the transaction (read back by the handler: a
// transaction Postgres aborted, one InnoDB rolled back and left, one that
// survived); that every other message applied once, or failed with nothing
// committed, or — where the culprit committed a group's transaction itself —
// came back Duplicate with its effect committed once; and that redelivering
// every failed message until it settles leaves each effect exactly once with
// one claim. The repository's docs/guarantees.md tabulates what each
// mistake costs in each mode.
package dialecttest
