package mysql

import (
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Partitioner = (*Dialect)(nil)

// DayColumn is the partition column of a partitioned claim table: the UTC
// date of the message's event time.
const DayColumn = "event_day"

// errNoPartition is ER_NO_PARTITION_FOR_GIVEN_VALUE: a row whose day has no
// partition.
const errNoPartition = 1526

// PartitionLockWait is how long a partition's ALTER TABLE waits for the
// claim table's metadata lock, which every open transaction on the table
// holds: MaintenanceLockSQL sets the session's lock_wait_timeout to it, so
// that claims queue behind a waiting ALTER TABLE for that long at most,
// then the ALTER TABLE fails with error 1205 and MaintainPartitions can run
// again later. It matches idempotent.PartitionLockTimeout.
const PartitionLockWait = 5 * time.Second

// maintenanceLockWait is how long MaintenanceLockSQL waits for another
// process's partition maintenance: a year, which is "until it ends" (or the
// context ends the session's wait by closing the connection). MariaDB reads
// a negative timeout, which MySQL takes as "forever", as an error.
const maintenanceLockWait = 365 * 24 * 60 * 60

// lockWaitSaveVar holds the session's own lock_wait_timeout, saved by
// MaintenanceLockSQL the first time it runs on a connection.
const lockWaitSaveVar = "@idempotent_lock_wait"

// noneDay is the value of the one partition a partitioned table is created
// with: MySQL cannot create a partitioned table without a partition, nor
// drop its last one. No claim has that day: the retention fence refuses
// event times that old.
const noneDay = "1000-01-01"

// PartitionedSchemaSQL returns the partitioned claim table, an InnoDB table
// keyed by (consumer, message_key, event_day) and partitioned by LIST
// COLUMNS (event_day), one partition per day. A unique key of a partitioned
// table must include every partitioning column, hence event_day in the
// primary key; since a message's event day never changes, its redeliveries
// still meet its claim.
//
// LIST rather than RANGE: a RANGE partition holds every value below its
// bound down to the previous partition's, so a day whose partition is
// missing would silently land in the next day's (and leave with it), and a
// day could only be added after the last one. A LIST partition holds its
// day and nothing else: a claim for a day without a partition fails with
// error 1526, which the middleware reports as ErrNoPartition, and days are
// added and dropped in any order. The table is created with one partition,
// p_none, for a day no claim has (1000-01-01). There is no processed_at
// index: old claims leave by dropping whole days.
//
// MySQL 8.0 and MariaDB both have this syntax. A server built without
// partitioning fails the CREATE TABLE with error 1289 ("The 'partitioning'
// feature is disabled"), which EnsureSchema returns.
func (*Dialect) PartitionedSchemaSQL(t dialect.Table) []string {
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     VARBINARY(128)  NOT NULL,
	message_key  VARBINARY(%d) NOT NULL,
	event_day    DATE            NOT NULL,
	processed_at DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
	claim_flip   TINYINT         NOT NULL DEFAULT 0,
	PRIMARY KEY (consumer, message_key, event_day)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC
PARTITION BY LIST COLUMNS (event_day) (PARTITION p_none VALUES IN ('%s'))`, quote(t), MaxKeyBytes, noneDay)}
}

// tableWhere matches t's rows in information_schema.TABLES or PARTITIONS:
// parameters database (nil for the session's) and table name.
const tableWhere = "TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"

func tableArgs(t dialect.Table) []any {
	var schema any
	if t.Schema != "" {
		schema = t.Schema
	}
	return []any{schema, t.Name}
}

// TableKindSQL returns whether t exists and whether it has partitions.
func (*Dialect) TableKindSQL(t dialect.Table) (string, []any) {
	return "SELECT EXISTS (SELECT 1 FROM information_schema.TABLES WHERE " + tableWhere + "), " +
			"EXISTS (SELECT 1 FROM information_schema.PARTITIONS WHERE " + tableWhere + " AND PARTITION_NAME IS NOT NULL)",
		append(tableArgs(t), tableArgs(t)...)
}

// ClaimAtSQL returns the claim with the event day, reporting new and
// duplicate claims as ClaimSQL does (1 and 2 rows affected). A row whose day
// has no partition fails with error 1526.
func (*Dialect) ClaimAtSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key, event_day) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE claim_flip = 1 - claim_flip", quote(t))
}

// PartitionName returns "p" followed by the day as YYYYMMDD. A MySQL
// partition is part of its table, not a table of its own, so its name need
// not repeat the table's.
func (*Dialect) PartitionName(_ dialect.Table, day time.Time) string {
	return "p" + day.UTC().Format("20060102")
}

// ListPartitionsSQL lists t's partitions named like days. Every one is
// attached: MySQL has no detached partitions.
func (*Dialect) ListPartitionsSQL(t dialect.Table) (string, []any) {
	return "SELECT PARTITION_NAME, TRUE FROM information_schema.PARTITIONS WHERE " + tableWhere +
			" AND PARTITION_NAME REGEXP ? ORDER BY PARTITION_NAME",
		append(tableArgs(t), "^p[0-9]{8}$")
}

// MaintenanceLockSQL returns a statement that waits for t's maintenance
// lock, a user lock (GET_LOCK) named like the cleanup lock, and sets the
// session's lock_wait_timeout to [PartitionLockWait] after saving its own
// value. Both outlive the transaction; ReleaseMaintenanceSQL undoes them.
func (*Dialect) MaintenanceLockSQL(t dialect.Table) string {
	return fmt.Sprintf("SET %[1]s = CAST(COALESCE(%[1]s, @@SESSION.lock_wait_timeout) AS UNSIGNED), SESSION lock_wait_timeout = %[2]d, @idempotent_maintenance_lock = %[3]s",
		lockWaitSaveVar, int64(PartitionLockWait/time.Second), takeLock(lockName("partitions", t), maintenanceLockWait))
}

// ReleaseMaintenanceSQL releases the maintenance lock and restores the
// session's lock_wait_timeout and innodb_lock_wait_timeout: the
// maintenance transaction shortens the latter with LockTimeoutSQL, and on
// MySQL that setting outlives the transaction too.
func (*Dialect) ReleaseMaintenanceSQL(t dialect.Table) (string, []any) {
	return fmt.Sprintf("SET @idempotent_maintenance_lock = RELEASE_LOCK(%[1]s), SESSION lock_wait_timeout = CAST(COALESCE(%[2]s, @@SESSION.lock_wait_timeout) AS UNSIGNED), "+
		"SESSION innodb_lock_wait_timeout = CAST(COALESCE(%[3]s, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED)",
		lockName("partitions", t), lockWaitSaveVar, lockSaveVar), nil
}

// CreatePartitionSQL returns ALTER TABLE … ADD PARTITION for day. MySQL has
// no IF NOT EXISTS here: the middleware decides under the maintenance lock,
// so the statement only runs for a day that has no partition (otherwise it
// fails with error 1517, duplicate partition name). Adding a LIST
// partition copies no rows; it waits for the table's metadata lock, for at
// most [PartitionLockWait].
func (d *Dialect) CreatePartitionSQL(t dialect.Table, day time.Time) string {
	return fmt.Sprintf("ALTER TABLE %s ADD PARTITION (PARTITION %s VALUES IN ('%s'))",
		quote(t), quoteIdent(d.PartitionName(t, day)), day.UTC().Format(time.DateOnly))
}

// DetachPartitionSQL returns "": MySQL cannot detach a partition, and needs
// not, since DROP PARTITION is itself a short metadata change. The
// middleware skips an empty statement and drops the day directly.
func (*Dialect) DetachPartitionSQL(dialect.Table, string) string { return "" }

// DropPartitionSQL returns ALTER TABLE … DROP PARTITION, which drops the
// day's claims with it. Like CreatePartitionSQL it has no IF EXISTS (the
// middleware drops only a partition it has just listed) and waits for the
// metadata lock for at most [PartitionLockWait].
func (*Dialect) DropPartitionSQL(t dialect.Table, partition string) string {
	return fmt.Sprintf("ALTER TABLE %s DROP PARTITION %s", quote(t), quoteIdent(partition))
}

// IsNoPartition reports error 1526, "Table has no partition for value".
func (*Dialect) IsNoPartition(err error) bool { return errorNumber(err) == errNoPartition }
