package mysql

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
)

var (
	_ dialect.Cleaner      = (*Dialect)(nil)
	_ dialect.LockReleaser = (*Dialect)(nil)
	_ dialect.StatsReader  = (*Dialect)(nil)
)

// Error numbers of a statement that ran out of its time.
const (
	errStatementTimeout = 1969 // ER_STATEMENT_TIMEOUT: MariaDB's max_statement_time
	errQueryTimeout     = 3024 // ER_QUERY_TIMEOUT: MySQL's max_execution_time (SELECT only)
)

// timeoutVar is the user variable StatementTimeoutSQL sets and
// CleanupBatchSQL reads: the batch's time limit in seconds.
const timeoutVar = "@idempotent_statement_timeout"

// timeArg formats t as the parameter the retention statements compare
// processed_at and the horizon with: UTC, microseconds (DATETIME(6)'s
// precision), rounded up, so that "processed_at < cutoff" holds for exactly
// the claims processed before t. A string, not a time.Time: the driver
// would convert a time.Time to the DSN's loc, while processed_at is stored
// in UTC whatever the session's time zone.
func timeArg(t time.Time) string {
	t = t.UTC()
	if u := t.Truncate(time.Microsecond); !u.Equal(t) {
		t = u.Add(time.Microsecond)
	}
	return t.Format("2006-01-02 15:04:05.000000")
}

// micros is a DATETIME(6) expression as microseconds since the Unix epoch:
// exact, and independent of the session's time zone (both sides are
// DATETIME).
func micros(expr string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + expr + ")"
}

// literal returns s as a string literal. Names reaching a dialect are plain
// identifiers (see dialect.ParseTable) and are written as they are; anything
// else is written in hex, which means the same bytes under every sql_mode.
func literal(s string) string {
	if dialect.CheckIdentifier(s) == nil {
		return "'" + s + "'"
	}
	return "X'" + hex.EncodeToString([]byte(s)) + "'"
}

// lockName returns the SQL expression naming t's user lock of kind: the
// kind and the SHA-1 of "database.table", where the database is the
// session's own for an unqualified table, so every spelling of one table
// ("t" in database shop, "shop.t") takes the same lock. The hash keeps the
// name within MySQL's 64 characters.
func lockName(kind string, t dialect.Table) string {
	db := "COALESCE(DATABASE(), '')"
	if t.Schema != "" {
		db = literal(t.Schema)
	}
	return fmt.Sprintf("CONCAT('idempotent:%s:', SHA1(CONCAT(%s, '.', %s)))", kind, db, literal(t.Name))
}

// takeLock returns an expression that takes the user lock named name,
// waiting up to wait seconds, and yields 1 when this session holds it. A
// lock this session already holds (a release that could not run, say) is
// not taken a second time: MySQL's user locks count, and the one release
// that follows must free it.
func takeLock(name string, wait int) string {
	return fmt.Sprintf("IF(IS_USED_LOCK(%[1]s) <=> CONNECTION_ID(), 1, COALESCE(GET_LOCK(%[1]s, %[2]d), 0))", name, wait)
}

// CleanupLockSQL returns a query for the table's cleanup lock, a user lock
// (GET_LOCK) with a timeout of 0: 1 when this session took it, 0 at once
// when another session holds it. The lock is named after the table and its
// database (see the package documentation). A user lock belongs to the
// session, not the transaction, so ReleaseCleanupSQL releases it before the
// transaction ends; a session that ends (a lost connection, a killed one)
// releases it too.
func (*Dialect) CleanupLockSQL(t dialect.Table) (string, []any) {
	return "SELECT " + takeLock(lockName("cleanup", t), 0), nil
}

// StatementTimeoutSQL returns a statement that sets a user variable to d in
// seconds, rounded up to the microsecond; CleanupBatchSQL reads it. On
// MariaDB the batch's DELETE runs under SET STATEMENT max_statement_time =
// that variable, so the limit applies to the DELETE alone and nothing of
// the session's settings changes. A DELETE that runs out of it fails with
// error 1969 and deletes nothing. MySQL has no time limit for a DELETE (its
// max_execution_time bounds SELECTs only): there the variable is set and
// not read, and only the batch size bounds a batch.
func (*Dialect) StatementTimeoutSQL(d time.Duration) string {
	us := (d + time.Microsecond - 1) / time.Microsecond
	us = max(us, 1)
	return fmt.Sprintf("SET %s = %d.%06d", timeoutVar, us/1_000_000, us%1_000_000)
}

// CleanupBatchSQL returns a DELETE joined with a derived table that picks at
// most limit claims processed before cutoff (of consumer unless it is ""),
// oldest first, from the processed_at index; the DELETE removes them by
// primary key and checks the cutoff again. Picking the rows apart keeps the
// plan on the processed_at index: a single-table DELETE … WHERE consumer = ?
// ORDER BY … LIMIT is planned on the primary key's consumer prefix, reading
// every claim of the consumer, recent ones included, and sorting them. The
// order is total (the primary key breaks ties), so the batch is
// deterministic and safe for statement-based replication. On MariaDB the DELETE runs under the
// limit StatementTimeoutSQL set (in a /*M! */ comment, which MySQL skips).
//
// Parameters: cutoff, consumer (when not ""), limit, cutoff.
func (*Dialect) CleanupBatchSQL(t dialect.Table, consumer string, cutoff time.Time, limit int) (string, []any) {
	q, c := quote(t), timeArg(cutoff)
	filter, order, args := "", "processed_at, consumer, message_key", []any{c, limit, c}
	if consumer != "" {
		// With the consumer fixed, naming it in the order would make
		// MariaDB sort what the index already yields in order.
		filter, order, args = " AND consumer = ?", "processed_at, message_key", []any{c, consumer, limit, c}
	}
	return fmt.Sprintf("/*M!100102 SET STATEMENT max_statement_time = %[1]s FOR */ DELETE c FROM %[2]s AS c JOIN ("+
		"SELECT consumer, message_key FROM %[2]s IGNORE INDEX (PRIMARY) WHERE processed_at < ?%[3]s ORDER BY %[4]s LIMIT ?"+
		") AS d ON c.consumer = d.consumer AND c.message_key = d.message_key WHERE c.processed_at < ?", timeoutVar, q, filter, order), args
}

// CountExpiredSQL returns the count of claims processed before cutoff (of
// consumer unless it is "").
func (*Dialect) CountExpiredSQL(t dialect.Table, consumer string, cutoff time.Time) (string, []any) {
	if consumer == "" {
		return fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE processed_at < ?", quote(t)), []any{timeArg(cutoff)}
	}
	return fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE processed_at < ? AND consumer = ?", quote(t)), []any{timeArg(cutoff), consumer}
}

// IsStatementTimeout reports error 1969 (MariaDB's max_statement_time) and
// 3024 (MySQL's max_execution_time).
func (*Dialect) IsStatementTimeout(err error) bool {
	n := errorNumber(err)
	return n == errStatementTimeout || n == errQueryTimeout
}

// errorNumber returns the error number of the *mysql.MySQLError in err's
// chain, or 0.
func errorNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// ReleaseCleanupSQL releases the cleanup lock (RELEASE_LOCK). It is the
// only thing to release: the statement timeout is a user variable that no
// other statement reads.
func (*Dialect) ReleaseCleanupSQL(t dialect.Table) (string, []any) {
	return "DO RELEASE_LOCK(" + lockName("cleanup", t) + ")", nil
}

// StatsSQL returns the claims per consumer with the oldest and newest
// processed_at as microseconds since the Unix epoch, so that they scan into
// integers whatever the driver's parseTime setting. It reads the whole
// table, or every partition of a partitioned one.
func (*Dialect) StatsSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT consumer, COUNT(*), %s, %s FROM %s GROUP BY consumer ORDER BY consumer",
		micros("MIN(processed_at)"), micros("MAX(processed_at)"), quote(t))
}
