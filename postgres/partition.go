package postgres

import (
	"fmt"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Partitioner = (*Dialect)(nil)

// DayColumn is the partition column of a partitioned claim table: the UTC
// date of the message's event time.
const DayColumn = "event_day"

// PartitionedSchemaSQL returns the partitioned claim table, partitioned by
// range of event_day with the primary key (consumer, message_key,
// event_day), after the same SchemaLockSQL as SchemaSQL, so that
// EnsureSchema in either mode serialises on the same key. It has no
// processed_at index: old claims leave by dropping whole days, so the index
// would only cost a write per claim. It creates no partition;
// MaintainPartitions does.
func (d *Dialect) PartitionedSchemaSQL(t dialect.Table) []string {
	return d.lockedSchemaSQL(t, true)
}

// TableKindSQL returns whether t exists and whether it is partitioned
// (relkind 'p').
func (*Dialect) TableKindSQL(t dialect.Table) (string, []any) {
	return `SELECT r.oid IS NOT NULL, coalesce(c.relkind = 'p', false)
FROM (SELECT to_regclass($1) AS oid) r LEFT JOIN pg_class c ON c.oid = r.oid`, []any{quote(t)}
}

// ClaimAtSQL returns INSERT … ON CONFLICT DO NOTHING with the event day. A
// row whose day has no partition fails with SQLSTATE 23514.
func (*Dialect) ClaimAtSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key, event_day) VALUES ($1, $2, $3::date) ON CONFLICT DO NOTHING", quote(t))
}

// PartitionName returns t's name followed by _pYYYYMMDD.
func (*Dialect) PartitionName(t dialect.Table, day time.Time) string {
	return t.Name + "_p" + day.UTC().Format("20060102")
}

func (d *Dialect) partition(t dialect.Table, name string) string {
	return dialect.Table{Schema: t.Schema, Name: name}.Quoted(pq.QuoteIdentifier)
}

// ListPartitionsSQL lists the tables of t's schema named like t's
// partitions, and whether each is attached to t.
func (*Dialect) ListPartitionsSQL(t dialect.Table) (string, []any) {
	return `SELECT c.relname::text, EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid AND i.inhparent = to_regclass($3))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = CASE WHEN $1 = '' THEN current_schema() ELSE $1 END
  AND c.relkind = 'r' AND c.relname ~ $2
ORDER BY c.relname`, []any{t.Schema, "^" + t.Name + "_p[0-9]{8}$", quote(t)}
}

// MaintenanceLockSQL returns pg_advisory_xact_lock on the table's OID.
func (*Dialect) MaintenanceLockSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, (%s)::oid::int4)", maintenanceLockClass, regclass(t))
}

// CreatePartitionSQL returns CREATE TABLE IF NOT EXISTS … PARTITION OF …
// FOR VALUES FROM (day) TO (day+1).
func (d *Dialect) CreatePartitionSQL(t dialect.Table, day time.Time) string {
	day = day.UTC()
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		d.partition(t, d.PartitionName(t, day)), quote(t), day.Format(time.DateOnly), day.AddDate(0, 0, 1).Format(time.DateOnly))
}

// DetachPartitionSQL returns ALTER TABLE … DETACH PARTITION. It takes an
// ACCESS EXCLUSIVE lock on t for a moment; the middleware bounds the wait
// with a lock timeout so that claims never queue behind it for long.
func (d *Dialect) DetachPartitionSQL(t dialect.Table, partition string) string {
	return fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", quote(t), d.partition(t, partition))
}

// DropPartitionSQL returns DROP TABLE IF EXISTS for a detached partition.
func (d *Dialect) DropPartitionSQL(t dialect.Table, partition string) string {
	return fmt.Sprintf("DROP TABLE IF EXISTS %s", d.partition(t, partition))
}

// IsNoPartition reports SQLSTATE 23514, which Postgres raises as "no
// partition of relation … found for row". The claim table has no CHECK
// constraint, so on the claim statement the code can mean nothing else.
func (*Dialect) IsNoPartition(err error) bool { return sqlState(err) == "23514" }
