package dialect

import "time"

// The interfaces in this file are optional: a [Dialect] implements them when
// its database can do what they describe. The middleware finds them with a
// type assertion and returns a clear error naming the dialect when a caller
// asks for a feature the dialect lacks.

// Cleaner is implemented by dialects that can delete expired claims in
// small batches, each in its own short transaction, with only one cleaner
// at a time per claim table. Every statement comes with its arguments, so
// the dialect chooses its own placeholders ($1, ?).
//
// A Cleaner is a [HorizonKeeper]: a cleanup first records in the database
// how far back the table has forgotten, then deletes.
type Cleaner interface {
	HorizonKeeper

	// CleanupLockSQL returns a query yielding one boolean row: true when the
	// current transaction took the claim table's cleanup lock, false at once
	// when another holds it. A lock that ends with the transaction is
	// preferred (it is safe behind a transaction-mode pooler); a dialect
	// whose lock is held by the session implements [LockReleaser], and the
	// middleware releases it before the transaction ends, on every path.
	CleanupLockSQL(t Table) (query string, args []any)

	// StatementTimeoutSQL returns a statement that bounds each later
	// statement of the current transaction to d. A dialect with a
	// session-scoped setting resets it through [LockReleaser].
	StatementTimeoutSQL(d time.Duration) string

	// CleanupBatchSQL returns a statement deleting at most limit claims
	// whose processed_at is before cutoff: claims of consumer, or of every
	// consumer when consumer is "". It reports the rows it deleted as rows
	// affected.
	CleanupBatchSQL(t Table, consumer string, cutoff time.Time, limit int) (stmt string, args []any)

	// CountExpiredSQL returns a query yielding the number of claims
	// CleanupBatchSQL would delete if run until nothing is left.
	CountExpiredSQL(t Table, consumer string, cutoff time.Time) (query string, args []any)

	// IsStatementTimeout reports whether err says a statement ran out of the
	// time set by StatementTimeoutSQL.
	IsStatementTimeout(err error) bool
}

// LockReleaser is implemented by dialects whose cleanup or maintenance lock
// (or statement timeout) outlives the transaction that took it, such as
// MySQL's GET_LOCK. The middleware runs the statement it returns as the last
// statement of every transaction that took the lock — after its work, before
// COMMIT or ROLLBACK — so that a pooled connection never keeps it. "" means
// nothing to release.
type LockReleaser interface {
	// ReleaseCleanupSQL releases what CleanupLockSQL and StatementTimeoutSQL
	// set.
	ReleaseCleanupSQL(t Table) (stmt string, args []any)
	// ReleaseMaintenanceSQL releases what MaintenanceLockSQL took.
	ReleaseMaintenanceSQL(t Table) (stmt string, args []any)
}

// The retention horizon.
//
// A claim table records how far back it has forgotten: its horizon. Every
// cleanup and every partition drop raises it, in the database, before it
// deletes; every claim that carries an event time is refused when the event
// is older than the horizon. So a retention window lengthened after a
// cleanup takes effect forward only, and two processes configured with
// different windows cannot re-apply what the shorter one forgot.
//
// The horizon lives in a table of its own beside the claim table (see
// HorizonTable), one row per consumer, and a row with consumer "" for a
// cleanup or partition drop of every consumer. A claim of consumer c is
// fenced by the later of c's row and the "" row. The value means, for a plain
// table, "claims processed before this time may be gone" and, for a table
// partitioned by day, "the claims of every event day before this (UTC
// midnight) are gone".

// HorizonKeeper is implemented by dialects that record a claim table's
// retention horizon. Times are passed as time.Time and read back as
// microseconds since the Unix epoch, so the middleware scans them the same
// way from every driver.
type HorizonKeeper interface {
	// HorizonTable returns the table holding t's horizon: t's name with the
	// suffix "_horizon", in t's schema.
	HorizonTable(t Table) Table

	// HorizonSchemaSQL returns the statements that create t's horizon table
	// if it does not exist, to be run in order in one transaction with the
	// claim table's schema.
	HorizonSchemaSQL(t Table) []string

	// AdvanceHorizonSQL returns a statement that raises consumer's horizon
	// ("" for every consumer) to before, inserting its row if missing and
	// never lowering it.
	AdvanceHorizonSQL(t Table, consumer string, before time.Time) (stmt string, args []any)

	// HorizonSQL returns a query yielding one row with one nullable integer,
	// microseconds since the Unix epoch: the later of consumer's horizon and
	// the "" row's, NULL when neither exists.
	HorizonSQL(t Table, consumer string) (query string, args []any)

	// HorizonsSQL returns a query, with no parameters, yielding every row
	// of t's horizon table — consumer (text), horizon (an integer of
	// microseconds since the Unix epoch) — ordered by consumer.
	HorizonsSQL(t Table) string
}

// HorizonClaimer is implemented by dialects that read the horizon in the
// claim statement itself, so the fence costs no round trip: the statement
// inserts the claim only when the horizon allows it. It affects one row when
// it inserted the claim and none otherwise; only then does the middleware
// read the horizon (HorizonSQL, in the claim's transaction) to tell a
// duplicate from a refusal — the horizon only rises, so a read after the
// statement that does not refuse the message shows the statement did not
// either. A statement reads the horizon from its snapshot, taken before the
// insert; the dialect must therefore also implement [SnapshotDrainer], and
// the middleware waits, after raising a horizon and before deleting anything
// below it, until no statement that may have read the old value is still
// running.
//
// Without a HorizonClaimer, the middleware reads the horizon (HorizonSQL)
// after a claim inserted, in the claim's transaction: a statement after the
// insert sees any cleanup that committed before the insert could succeed,
// provided it reads the rows as last committed rather than from a snapshot
// the transaction took earlier (before a coalesced group's earlier
// handlers, or a caller's own reads) — the MySQL dialect's HorizonSQL is a
// locking read for that reason.
type HorizonClaimer interface {
	// HorizonClaimSQL returns the claim statement with the horizon folded
	// in: parameters consumer $1, key $2, the event day $3 (a "2006-01-02"
	// string) when partitioned, and last the fence value (a time.Time, or
	// nil for a message without an event time, which no horizon refuses).
	// It inserts the claim only when the horizon is not after the fence
	// value, and reports the rows it inserted (1 or 0) as rows affected.
	HorizonClaimSQL(t Table, partitioned bool) string
}

// SnapshotDrainer is implemented by dialects that can tell whether any
// other session of the database may still run a statement whose snapshot
// predates the latest change of a horizon row.
type SnapshotDrainer interface {
	// OlderSnapshotsSQL returns a query yielding one integer: how many
	// other sessions hold a snapshot taken before consumer's horizon row
	// ("" for the every-consumer row) last changed.
	OlderSnapshotsSQL(t Table, consumer string) (query string, args []any)
}

// StatsReader is implemented by dialects that can summarise the claim table
// per consumer, for ClaimTable.Stats.
type StatsReader interface {
	// StatsSQL returns a query, with no parameters, yielding one row per
	// consumer with claims in the table — consumer, number of claims, oldest
	// and newest processed_at — ordered by consumer. The times are integers
	// of microseconds since the Unix epoch, as the horizon's are, so the
	// middleware scans them the same way from every driver (MySQL's
	// DATETIME arrives as text without the driver's parseTime, SQLite's
	// processed_at is text).
	StatsSQL(t Table) string
}

// Partitioner is implemented by dialects that can keep the claim table
// partitioned by the day of each message's event time, so that old claims
// leave by dropping a whole day instead of deleting rows.
//
// The day is a UTC calendar date. It is part of the primary key (consumer,
// message_key, day): a database can only enforce a unique key on a
// partitioned table if the key contains the partition column. Because the day
// comes from the producer-assigned event time, every redelivery and replay of
// a message carries the same day, lands in the same partition and meets its
// earlier claim.
//
// Partition names end in "pYYYYMMDD" (see PartitionName): on Postgres a
// partition is a table of the claim table's schema, named "<table>_pYYYYMMDD";
// on MySQL it is part of the claim table, named "pYYYYMMDD". Dates are the
// only values written into DDL text; they are formatted from a time.Time,
// never taken from input.
//
// A Partitioner is a [HorizonKeeper]: a partition drop first records in the
// database that the day is gone, then drops it.
type Partitioner interface {
	HorizonKeeper

	// PartitionedSchemaSQL returns the statements that create the
	// partitioned claim table (with no partition) and its processed_at
	// index if they do not exist, to be run in order in one transaction.
	PartitionedSchemaSQL(t Table) []string

	// TableKindSQL returns a query yielding one row with two booleans: does
	// the table exist, and is it partitioned.
	TableKindSQL(t Table) (query string, args []any)

	// ClaimAtSQL returns the claim statement for a partitioned table:
	// consumer $1, message key $2 and event day $3 (a "2006-01-02" string).
	// Like [Dialect.ClaimSQL] it affects one row when the claim is new and
	// none when it exists.
	ClaimAtSQL(t Table) string

	// PartitionName returns the unquoted name of day's partition of t.
	PartitionName(t Table, day time.Time) string

	// ListPartitionsSQL returns a query yielding one row per table in t's
	// schema whose name looks like one of t's partitions: its name (text) and
	// whether it is attached to t (boolean). Tables detached by an
	// interrupted drop are listed too.
	ListPartitionsSQL(t Table) (query string, args []any)

	// MaintenanceLockSQL returns a statement that waits for t's
	// maintenance lock, which serialises partition creation, detaching and
	// dropping between processes. A lock that ends with the transaction is
	// preferred; a dialect whose lock is held by the session implements
	// [LockReleaser] (ReleaseMaintenanceSQL).
	MaintenanceLockSQL(t Table) string

	// CreatePartitionSQL returns the statement that creates day's partition
	// of t, covering [day, day+1), if it does not exist.
	CreatePartitionSQL(t Table, day time.Time) string

	// DetachPartitionSQL returns the statement that detaches the named
	// partition from t, or "" when the database drops a partition in one
	// short step and has no detach (MySQL): the middleware then goes
	// straight to DropPartitionSQL.
	DetachPartitionSQL(t Table, partition string) string

	// DropPartitionSQL returns the statement that drops the named (detached)
	// partition if it exists.
	DropPartitionSQL(t Table, partition string) string

	// IsNoPartition reports whether err, returned by the ClaimAtSQL
	// statement, says no partition exists for the row's day.
	IsNoPartition(err error) bool
}
