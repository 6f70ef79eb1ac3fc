// Package mocks unit-tests code built on the idempotent middleware without a
// database, on github.com/DATA-DOG/go-sqlmock.
//
// [New] returns a *sql.DB and its sqlmock.Sqlmock, matching SQL text exactly
// (sqlmock.QueryMatcherEqual: the default regexp matcher breaks on $1 and
// parentheses) and checking in t.Cleanup that every expectation was met and
// no connection is left in use. [For] wraps the mock in a [Mock] that also
// knows the statements the middleware sends for one delivery, taking their
// text from the dialect itself, so a test never spells the claim's SQL and
// cannot drift from it:
//
//	db, mock := mocks.New(t)
//	mw, _ := idempotent.New(db, postgres.New(), "loyalty")
//	m := mocks.For(mock, postgres.New(), "loyalty")
//
//	m.ExpectApplied("order-completed:9912")  // BEGIN, claim inserts
//	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
//		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1)) // the handler's effect
//	m.ExpectCommit()                         // COMMIT
//
// A delivery is scripted as one of:
//
//   - applied: [Mock.ExpectApplied], the handler's own expectations, then
//     [Mock.ExpectCommit] — or, when the handler fails, the failing
//     expectation and ExpectRollback;
//   - duplicate: [Mock.ExpectDuplicate] (the middleware rolls the claim's
//     transaction back; the handler does not run);
//   - a failed claim: [Mock.ExpectClaimError];
//   - a failed commit: [Mock.ExpectCommitError]. database/sql sends no
//     ROLLBACK after a failed COMMIT, so none is expected.
//
// A retry is simply the next attempt: after a claim or commit that fails with
// an error the dialect classifies as retryable (with the Postgres dialect,
// &pq.Error{Code: "40001"} or "40P01", a lost connection such as
// driver.ErrBadConn or "57P01"), script the next attempt with ExpectApplied
// or ExpectDuplicate again. The middleware sleeps between attempts with no
// statement sent. If a commit that failed with a lost connection did land,
// the retry finds the claim: ExpectDuplicate. When the handler fails with
// such an error, the middleware first checks whether the transaction itself
// suffered it: script [Mock.ExpectTxCheck], then ExpectRollback, then the
// next attempt if the check found the transaction aborted or its
// connection lost.
//
// Every entry point has its scripts:
//
//   - ProcessMessages and WrapMessages of messages without event times,
//     given by their keys: [Mock.ExpectBatchApplied] (with the keys whose
//     claims are new), [Mock.ExpectBatchDuplicate] and
//     [Mock.ExpectBatchClaimError]. The claim is the dialect's: one query
//     for the whole batch with a dialect.BatchClaimer (Postgres), one
//     statement per distinct key, in ascending order, otherwise.
//   - ProcessMessages and WrapMessages of any messages: [Mock.ExpectMessagesApplied],
//     [Mock.ExpectMessagesDuplicate] and [Mock.ExpectMessagesBeyondHorizon],
//     in plain and partitioned mode (there, each distinct key claimed in the
//     event day of its first message).
//   - ProcessMessage on a Middleware WithCoalescing, whose concurrent calls
//     share a group's transaction: [Mock.ExpectGroupBegin], then each
//     member in key order — [Mock.ExpectGroupApplied] followed by its
//     handler's statements, or [Mock.ExpectGroupDuplicate] (and their
//     event-time forms) — then [Mock.ExpectGroupCommit]; the helpers script
//     what the Middleware sends between the handlers in its design (the
//     fence on Postgres, or the savepoints).
//   - ProcessNatural: [Mock.ExpectNatural] (BEGIN), the handler's own
//     conflict-free insert, then ExpectCommit, sent whether or not the
//     insert took effect.
//   - ProcessMessage, WrapMessage, ClaimMessage and the
//     other entry points given a message with its event time, in either
//     mode: [Mock.ExpectAppliedAt], [Mock.ExpectDuplicateAt],
//     [Mock.ExpectClaimErrorAt], [Mock.ExpectBeyondHorizonAt] and
//     [Mock.ExpectClaimAt]. The helpers without an event time script a
//     message without one. In partitioned mode ([WithDailyPartitions]) the
//     claim carries the event's UTC day; a day without a partition is
//     ExpectClaimErrorAt with the dialect's error (with Postgres,
//     &pq.Error{Code: "23514"}), which the Middleware returns as
//     idempotent.ErrNoPartition. A message the
//     retention fence refuses — older than the window, zero, or later than
//     the clock plus the clock-skew margin — sends nothing:
//     [Mock.ExpectFenced] says so, and checks it. The event-time helpers
//     apply the same fence, and panic if the Middleware would refuse the
//     message; the helpers without an event time panic in partitioned
//     mode, as the Middleware refuses such messages before sending
//     anything.
//
// The claims are fenced by the claim table's retention horizon (see
// dialect.HorizonKeeper): how far back a cleanup or partition drop has
// forgotten, recorded in the database. The helpers script the statements
// that carry it, answering that no horizon is recorded, so a claim is
// refused only where a test says so:
//
//   - With a dialect.HorizonClaimer (Postgres), a message's claim is one
//     query that also reads the horizon: its arguments end with the fence
//     value — NULL for a message without an event time, the event's UTC
//     midnight in partitioned mode, the event time less the clock-skew
//     margin otherwise — and it answers how many claims it inserted and
//     the horizon it read. A dialect that keeps a horizon but does not read
//     it in the claim has its horizon read after a new claim with an event
//     time.
//   - A batch's new claims with event times are followed by the read of
//     the horizon, in the batch's transaction.
//   - In partitioned mode a claim that meets no partition is followed by
//     the read of the horizon, which tells a dropped day
//     (idempotent.ErrBeyondRetention) from one not created yet.
//   - [Mock.ExpectEnsureSchema] includes the horizon table's schema.
//
// [Mock.ExpectBeyondHorizonAt], [Claim.WillRefuse] and
// [Mock.ExpectMessagesBeyondHorizon] script a horizon that refuses the
// message: one within the Middleware's own retention window that a cleanup
// with a shorter window may already have forgotten.
//
// The helpers follow the options the Middleware was built with. Use
// [ForMiddleware], which reads them from the Middleware: dialect, consumer,
// table, lock timeout, strict guard, retention window, clock-skew margin,
// clock and partitioned mode. [For] is told them instead: [WithTable],
// [WithLockTimeout], [WithStrictGuard], [WithRetention], [WithClockSkew],
// [WithClock] and [WithDailyPartitions] match the idempotent options of
// the same names. The helpers work with any dialect.Dialect, including the
// optional statements some dialects add: a lock timeout reset after the
// claim (dialect.LockTimeoutResetter) and the server check of EnsureSchema
// (dialect.ServerChecker; see [Mock.ExpectEnsureSchema], which does not
// script a partitioned table's schema).
package mocks
