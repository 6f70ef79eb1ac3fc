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
// handler that commits or rolls back the transaction itself. MySQL has no
// such variable: there the guard's query fails (error 1193) on every
// applied message, so do not enable it on MySQL.
package mysql
