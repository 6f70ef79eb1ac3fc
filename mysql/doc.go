// Package mysql is the MySQL and MariaDB dialect of the idempotent
// middleware, for the driver github.com/go-sql-driver/mysql. It is tested
// against MariaDB 10.11; it needs MySQL 8.0.13 or MariaDB 10.2 or later
// (for the expression default of processed_at).
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/shop")
//	mw, err := idempotent.New(db, mysql.New(), "loyalty")
//	err = mw.EnsureSchema(ctx)
//
// # The claim
//
// The claim table is InnoDB, keyed by (consumer VARBINARY(128),
// message_key VARBINARY(1024)): byte comparison, so keys differ by case
// and by trailing spaces as they do on Postgres. EnsureSchema checks that
// the server is MySQL or MariaDB, that InnoDB is available and that an
// existing claim table uses it.
//
// The claim statement is INSERT … ON DUPLICATE KEY UPDATE claim_flip =
// 1 - claim_flip, never INSERT IGNORE, which would also hide truncation
// and other errors. The server reports 1 affected row for a new claim and
// 2 for a duplicate, under both settings of the driver's clientFoundRows
// DSN parameter: a no-op update ("consumer = consumer") would report 0 for
// a duplicate normally but 1 with clientFoundRows=true, indistinguishable
// from an insert, and the effect would be applied twice. The tests run
// both settings.
//
// # Errors and timeouts
//
// Deadlocks (1213, SQLSTATE 40001) and MariaDB's write conflict 1020 are
// retried, as are lost connections (mysql.ErrInvalidConn,
// driver.ErrBadConn, 1053, 1927, 2006, 2013). A lock wait timeout (1205)
// is idempotent.ErrClaimBusy.
//
// WithLockTimeout sets innodb_lock_wait_timeout, in whole seconds (at least
// 1s), for the claim statement only: the variable is per session, not per
// transaction, so the middleware restores the session's own value right
// after the claim (see [Dialect.LockTimeoutSQL]), and the handler's own
// lock waits keep the session's timeout.
//
// WithStrictGuard reads MariaDB's @@in_transaction, which catches a
// handler that commits or rolls back the transaction itself, before commit
// and, when the handler fails, once more. MySQL has no such variable: there
// EnsureSchema fails (error 1193) when the strict guard is on, rather than
// every applied message.
//
// # Implicit commits
//
// MySQL and MariaDB commit the open transaction to run DDL (CREATE, ALTER,
// DROP, RENAME, TRUNCATE, except of TEMPORARY tables), LOCK TABLES, account
// management and a few administrative statements
// ([Dialect.CommitsImplicitly] lists them). Run through the claim's
// transaction, such a statement would commit the claim with the part of the
// effect run so far; if the handler then failed, the redelivery would be a
// Duplicate and the rest of the effect lost. The dialect implements
// dialect.ImplicitCommitter, so a database opened through
// idempotent.GuardConnector refuses these statements with
// idempotent.ErrAutocommit before they reach the server. Without the guard,
// WithStrictGuard on MariaDB reports it after the fact: the error matches
// ErrAutocommit and says the claim committed without its full effect.
//
// # Retention
//
// The dialect implements batched cleanup (dialect.Cleaner, with
// dialect.LockReleaser), statistics (dialect.StatsReader), the retention
// horizon (dialect.HorizonKeeper) and daily partitions
// (dialect.Partitioner), on MariaDB and on MySQL 8.0 alike; it is tested
// against MariaDB 10.11.
//
// A cleanup batch is one DELETE joined with a derived table that picks at
// most a batch of claims from the processed_at index, oldest first, and
// deletes them by primary key ([Dialect.CleanupBatchSQL]). Only one cleanup
// runs per table at a time: a batch takes the table's user lock with
// GET_LOCK(name, 0), which answers at once, and another cleanup that finds
// it held stops. The name is "idempotent:cleanup:" and the SHA-1 of
// "database.table" (the session's database for an unqualified table), so
// every spelling of one table takes the same lock and a table of the same
// name in another database does not. A user lock belongs to the session,
// not the transaction: the middleware releases it (ReleaseCleanupSQL,
// RELEASE_LOCK) before each batch's transaction ends, and a session that
// ends releases it too. A lock the session already holds is not taken
// twice, so a release that could not run is repaired by the next batch on
// that connection.
//
// On MariaDB a batch's DELETE runs under SET STATEMENT max_statement_time
// (the cleanup's StatementTimeout), which bounds that statement alone and
// changes nothing of the session; a batch that runs out of it fails with
// error 1969, deletes nothing, and the next batch is half the size. MySQL
// has no time limit for a DELETE (max_execution_time bounds SELECTs only):
// there a batch is bounded by its size.
//
// The horizon table, <table>_horizon, holds one row per consumer with a
// DATETIME(6) in UTC, like processed_at; its statements read it back as
// microseconds since the epoch (TIMESTAMPDIFF from 1970-01-01, whatever the
// session's time zone). All times reach the server as UTC text, so neither
// the DSN's loc nor parseTime matters.
//
// A partitioned claim table (WithDailyPartitions) is keyed by (consumer,
// message_key, event_day) and partitioned by LIST COLUMNS (event_day), one
// partition p20310315 per day ([Dialect.PartitionedSchemaSQL] says why LIST
// rather than RANGE). A claim for a day without a partition fails with
// error 1526, which the middleware reports as ErrNoPartition. MySQL cannot
// detach a partition, so a day is dropped directly (DROP PARTITION, a
// short metadata change; DetachPartitionSQL is ""). Creating and dropping
// days is serialised between processes by another user lock, taken by
// MaintenanceLockSQL and released by ReleaseMaintenanceSQL, which also
// restores the session's lock waits: the ALTER TABLE waits for the table's
// metadata lock, which every open claim transaction holds, for at most
// [PartitionLockWait], so that claims never queue long behind it.
//
// # Isolation levels
//
// WithTxOptions accepts the levels go-sql-driver/mysql can begin: Default,
// Read Uncommitted, Read Committed, Repeatable Read and Serializable
// ([Dialect.CheckTxOptions]); New refuses the others.
package mysql
