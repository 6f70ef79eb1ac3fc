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
//   - ProcessBatch and WrapBatch: [Mock.ExpectBatchApplied] (with the keys
//     whose claims are new), [Mock.ExpectBatchDuplicate] and
//     [Mock.ExpectBatchClaimError]. The claim is the dialect's: one query
//     for the whole batch with a dialect.BatchClaimer (Postgres), one
//     statement per distinct key, in ascending order, otherwise.
//   - ProcessMessages and WrapMessages: [Mock.ExpectMessagesApplied] and
//     [Mock.ExpectMessagesDuplicate], in plain and partitioned mode (there,
//     one claim per distinct key in the event day of its first message).
//   - ProcessNatural: [Mock.ExpectNatural] (BEGIN), the handler's own
//     conflict-free insert, then ExpectCommit, sent whether or not the
//     insert took effect.
//   - ProcessEvent, WrapEvent and ClaimEvent, messages with their event
//     time: [Mock.ExpectAppliedAt], [Mock.ExpectDuplicateAt],
//     [Mock.ExpectClaimErrorAt] and [Mock.ExpectClaimAt]. In partitioned
//     mode ([WithDailyPartitions]) the claim carries the event's UTC day; a
//     day without a partition is ExpectClaimErrorAt with the dialect's
//     error (with Postgres, &pq.Error{Code: "23514"}), which the
//     Middleware returns as idempotent.ErrNoPartition. A message the
//     retention fence refuses — older than the window, zero, or later than
//     the clock plus the clock-skew margin — sends nothing:
//     [Mock.ExpectFenced] says so, and checks it. The event-time helpers
//     apply the same fence, and panic if the Middleware would refuse the
//     message; the helpers without an event time panic in partitioned
//     mode, as the Middleware refuses such messages before sending
//     anything.
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
