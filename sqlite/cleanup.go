package sqlite

import (
	"fmt"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var (
	_ dialect.Cleaner           = (*Dialect)(nil)
	_ dialect.CleanupLockWaiter = (*Dialect)(nil)
	_ dialect.StatsReader       = (*Dialect)(nil)
)

// IsCleanupLockBusy reports SQLITE_BUSY and its extended codes: the write
// lock, which is the cleanup lock, stayed taken past the busy timeout, by
// another cleanup's batch or by any other writer (a long claim
// transaction), through every retry.
func (d *Dialect) IsCleanupLockBusy(err error) bool { return d.IsDDLLockTimeout(err) }

// timeText formats t the way processed_at is stored, UTC text that SQLite's
// date functions read ("2024-05-01 12:00:00.123"), so that the retention
// statements compare text with text and use the processed_at index. t is
// rounded up to the microsecond, and the digits after the milliseconds are
// written only when they are not zero: a claim stamped by the column's
// default (milliseconds) then compares as its time does, and
// "processed_at < cutoff" holds for exactly the claims processed before t.
func timeText(t time.Time) string {
	t = t.UTC()
	if u := t.Truncate(time.Microsecond); !u.Equal(t) {
		t = u.Add(time.Microsecond)
	}
	s := t.Format("2006-01-02 15:04:05.000000")
	return s[:len(s)-3] + strings.TrimRight(s[len(s)-3:], "0")
}

// micros is a processed_at-style text expression as microseconds since the
// Unix epoch, computed exactly from its parts: whole seconds from
// strftime('%s'), and the fraction's first six digits from the text itself
// (julianday's floating point would be off by a few microseconds).
func micros(expr string) string {
	return fmt.Sprintf("CAST(strftime('%%s', %[1]s) AS INTEGER) * 1000000 + CAST(substr(substr(%[1]s, 21) || '000000', 1, 6) AS INTEGER)", expr)
}

// CleanupLockSQL returns a query that answers true: on SQLite the cleanup
// lock is the database's write lock, which a transaction of a connection
// opened by [Open] (or with [DSN]'s settings) holds from BEGIN IMMEDIATE
// on. SQLite runs one writer at a time, so two cleanups never delete at
// once; a second cleanup's batch waits at BEGIN for the first one's batch
// to commit (within busy_timeout), then goes on, and between them every
// claim is deleted once. A query that answered false while another writer
// held the lock would also answer false whenever a claim was being
// written, and stop cleanups for no reason on a busy database. (On a
// connection that begins deferred transactions, the batch takes the write
// lock at its first write, AdvanceHorizonSQL, and a conflicting commit in
// between fails it with SQLITE_BUSY_SNAPSHOT, which the middleware
// retries.)
func (*Dialect) CleanupLockSQL(dialect.Table) (string, []any) { return "SELECT 1", nil }

// StatementTimeoutSQL returns "": SQLite has no statement timeout, and the
// middleware skips an empty statement. A batch is bounded by its size; it
// holds the write lock while it runs, so a very large one makes claims wait
// at BEGIN (up to busy_timeout). A context that ends interrupts the batch.
func (*Dialect) StatementTimeoutSQL(time.Duration) string { return "" }

// CleanupBatchSQL returns a DELETE of the claims whose primary key a LIMITed
// subquery picks from the processed_at index, oldest first, and that are
// still before cutoff. (SQLite's DELETE … LIMIT needs a compile option that
// modernc.org/sqlite does not set.) For one consumer the subquery writes
// "+consumer", so that the planner keeps to the processed_at index instead
// of reading all the consumer's claims by primary key and sorting them.
//
// Parameters: ?1 cutoff, ?2 limit, ?3 consumer (when not "").
func (*Dialect) CleanupBatchSQL(t dialect.Table, consumer string, cutoff time.Time, limit int) (string, []any) {
	q, filter, args := quote(t), "", []any{timeText(cutoff), limit}
	if consumer != "" {
		filter, args = " AND +consumer = ?3", append(args, consumer)
	}
	return fmt.Sprintf("DELETE FROM %[1]s WHERE processed_at < ?1 AND (consumer, message_key) IN ("+
		"SELECT consumer, message_key FROM %[1]s WHERE processed_at < ?1%[2]s ORDER BY processed_at LIMIT ?2)", q, filter), args
}

// CountExpiredSQL returns the count of claims processed before cutoff (of
// consumer unless it is "").
func (*Dialect) CountExpiredSQL(t dialect.Table, consumer string, cutoff time.Time) (string, []any) {
	if consumer == "" {
		return fmt.Sprintf("SELECT count(*) FROM %s WHERE processed_at < ?1", quote(t)), []any{timeText(cutoff)}
	}
	return fmt.Sprintf("SELECT count(*) FROM %s WHERE processed_at < ?1 AND consumer = ?2", quote(t)), []any{timeText(cutoff), consumer}
}

// IsStatementTimeout reports false: SQLite has no statement timeout (see
// StatementTimeoutSQL).
func (*Dialect) IsStatementTimeout(error) bool { return false }

// StatsSQL returns the claims per consumer with the oldest and newest
// processed_at as microseconds since the Unix epoch: processed_at is text,
// which modernc.org/sqlite returns as a string.
func (*Dialect) StatsSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT consumer, n, %s, %s FROM (SELECT consumer, count(*) AS n, min(processed_at) AS oldest, max(processed_at) AS newest FROM %s GROUP BY consumer) ORDER BY consumer",
		micros("oldest"), micros("newest"), quote(t))
}
