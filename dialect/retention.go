package dialect

import "time"

// The interfaces in this file are optional: a [Dialect] implements them when
// its database can do what they describe. The middleware finds them with a
// type assertion and returns a clear error naming the dialect when a caller
// asks for a feature the dialect lacks.

// Cleaner is implemented by dialects that can delete expired claims in
// small batches, each in its own short transaction, with only one cleaner
// at a time per claim table.
type Cleaner interface {
	// CleanupLockSQL returns a query yielding one boolean row: true when the
	// current transaction took the claim table's cleanup lock, false at once
	// when another transaction holds it. The lock must be released when the
	// transaction ends (never held by the session), so that it is safe behind
	// a transaction-mode connection pooler.
	CleanupLockSQL(t Table) string

	// StatementTimeoutSQL returns a statement that bounds each later
	// statement of the current transaction, and only of it, to d.
	StatementTimeoutSQL(d time.Duration) string

	// CleanupBatchSQL returns a statement deleting at most $2 claims whose
	// processed_at is before $1 (a time.Time). Unless allConsumers is set it
	// deletes only claims of consumer $3. It reports the rows it deleted as
	// rows affected.
	CleanupBatchSQL(t Table, allConsumers bool) string

	// CountExpiredSQL returns a query yielding the number of claims
	// CleanupBatchSQL would delete if run until nothing is left: parameters
	// $1 (cutoff) and, unless allConsumers, $2 (consumer).
	CountExpiredSQL(t Table, allConsumers bool) string

	// IsStatementTimeout reports whether err says a statement ran out of the
	// time set by StatementTimeoutSQL.
	IsStatementTimeout(err error) bool
}

// StatsReader is implemented by dialects that can summarise the claim table
// per consumer, for ClaimTable.Stats.
type StatsReader interface {
	// StatsSQL returns a query, with no parameters, yielding one row per
	// consumer with claims in the table — consumer, number of claims, oldest
	// and newest processed_at — ordered by consumer.
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
// Partition names are the table's name followed by "_pYYYYMMDD", in the
// table's schema. Dates are the only values written into DDL text; they are
// formatted from a time.Time, never taken from input.
type Partitioner interface {
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
	// transaction-scoped maintenance lock, which serialises partition
	// creation, detaching and dropping between processes.
	MaintenanceLockSQL(t Table) string

	// CreatePartitionSQL returns the statement that creates day's partition
	// of t, covering [day, day+1), if it does not exist.
	CreatePartitionSQL(t Table, day time.Time) string

	// DetachPartitionSQL returns the statement that detaches the named
	// partition from t.
	DetachPartitionSQL(t Table, partition string) string

	// DropPartitionSQL returns the statement that drops the named (detached)
	// partition if it exists.
	DropPartitionSQL(t Table, partition string) string

	// IsNoPartition reports whether err, returned by the ClaimAtSQL
	// statement, says no partition exists for the row's day.
	IsNoPartition(err error) bool
}
