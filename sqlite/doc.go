// Package sqlite is the SQLite dialect of the idempotent middleware, for the
// pure-Go driver modernc.org/sqlite (no cgo), whose driver name is "sqlite".
//
// # Opening the database
//
// [Open] returns a *sql.DB configured for claims; [DSN] returns the same
// settings as a data source name, for idempotent.OpenGuarded or sql.Open:
//
//	db, err := sqlite.Open("/var/lib/loyalty/loyalty.db")
//	mw, err := idempotent.New(db, sqlite.New(), "loyalty")
//
// Every connection gets:
//
//   - journal_mode=WAL: readers do not block the writer, nor it them.
//   - busy_timeout=5000 ([BusyTimeout]): a connection that finds the database
//     locked by another writer waits up to 5s before failing with
//     SQLITE_BUSY, which the middleware retries.
//   - synchronous=FULL: a commit is on disk before COMMIT returns, so a
//     message acknowledged after ProcessMessage cannot lose its effect to a power
//     cut (WAL's common NORMAL setting could).
//   - _txlock=immediate: every read-write transaction begins with BEGIN
//     IMMEDIATE, taking the write lock at once. Writers then queue at BEGIN,
//     under busy_timeout, instead of failing when a read lock cannot be
//     upgraded (SQLITE_BUSY_SNAPSHOT) halfway through a transaction.
//
// # How it differs from Postgres
//
// SQLite has one writer at a time. A duplicate delivery does not wait at its
// claim behind the holder's row, as on Postgres: it waits at BEGIN for the
// holder's whole transaction, then finds the claim (Duplicate) or, if the
// holder rolled back, inserts it (Applied). The outcome is the same; the
// concurrency is one transaction at a time.
//
// The claim is INSERT … ON CONFLICT DO NOTHING (SQLite 3.24 or later).
// SQLITE_BUSY and SQLITE_LOCKED, with all their extended codes, are
// retryable. WithLockTimeout is not supported: the only wait is at BEGIN,
// bounded by each connection's busy_timeout, so idempotent.New fails with
// WithLockTimeout. WithStrictGuard is not supported either (SQLite has no
// transaction id), and idempotent.New says so. SQLite reports a missing
// table only as a generic SQLITE_ERROR, so a missing claim table fails with
// the driver's "no such table" error rather than idempotent.ErrNoClaimTable.
//
// Use a file, never ":memory:": each pooled connection would get a database
// of its own.
//
// # Retention
//
// The dialect implements batched cleanup (dialect.Cleaner), statistics
// (dialect.StatsReader) and the retention horizon (dialect.HorizonKeeper).
// It has no partitions: WithDailyPartitions is refused by New.
//
// A cleanup batch deletes the claims whose primary key a LIMITed subquery
// picks from the processed_at index ([Dialect.CleanupBatchSQL]). The
// one-runner lock is SQLite's write lock: a batch's transaction holds it
// from BEGIN IMMEDIATE on, so two cleanups never delete at once, and
// CleanupLockSQL answers true. A second cleanup is not stopped but waits at
// BEGIN for each of the first one's batches, within busy_timeout; between
// them every claim is deleted once. SQLite has no statement timeout
// (StatementTimeoutSQL is "", which the middleware skips; a batch is bounded
// by its size), and its waiting writers poll: a cleanup that starts its
// next batch at once keeps the write lock nearly all the time. Give it a
// pause between batches (CleanupOptions.Pause, the CLI's -pause) about as
// long as a batch takes, or claims wait for most of the cleanup: with no
// pause, two claims got in during a 1 s cleanup of 200,000 claims, one
// after 0.93 s; with a pause as long as each batch, 598 did, the slowest in
// 13 ms.
//
// Times are stored as processed_at is, UTC text ("2031-02-01
// 12:00:00.123"), in the horizon table <table>_horizon as well. The
// retention statements are given times in that format (with microseconds
// when they are not zero), so text comparison is time comparison and uses
// the processed_at index, and they read times back as exact microseconds
// since the epoch.
package sqlite
