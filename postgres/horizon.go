package postgres

import (
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var (
	_ dialect.HorizonKeeper   = (*Dialect)(nil)
	_ dialect.HorizonClaimer  = (*Dialect)(nil)
	_ dialect.SnapshotDrainer = (*Dialect)(nil)

	_ dialect.HorizonClaimFolder = (*Dialect)(nil)
)

// HorizonName returns the name of the horizon table of the claim table name
// (unqualified, unquoted): name + "_horizon" when that fits in Postgres's
// 63-byte identifiers, else a prefix of name, a hash of the whole name and
// the suffix, so two long names sharing a prefix never share a horizon.
func HorizonName(name string) string { return suffixed(name, "_horizon") }

// HorizonTable returns t's horizon table, HorizonName(t.Name) in t's schema.
func (*Dialect) HorizonTable(t dialect.Table) dialect.Table {
	return dialect.Table{Schema: t.Schema, Name: HorizonName(t.Name)}
}

func (d *Dialect) horizon(t dialect.Table) string { return quote(d.HorizonTable(t)) }

// micros is a timestamptz expression as microseconds since the Unix epoch.
func micros(expr string) string {
	return "(extract(epoch FROM " + expr + ") * 1000000)::bigint"
}

// HorizonSchemaSQL returns the horizon table: one row per consumer ("" for
// every consumer) with the time before which claims may be gone.
func (d *Dialect) HorizonSchemaSQL(t dialect.Table) []string {
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer         text        PRIMARY KEY,
	forgotten_before timestamptz NOT NULL
)`, d.horizon(t))}
}

// AdvanceHorizonSQL returns an upsert that only ever raises the row: a row
// already at or past before is left untouched, so its xmin (which
// OlderSnapshotsSQL compares snapshots with) still names the transaction
// that last raised it.
func (d *Dialect) AdvanceHorizonSQL(t dialect.Table, consumer string, before time.Time) (string, []any) {
	h := d.horizon(t)
	return fmt.Sprintf(`INSERT INTO %[1]s AS h (consumer, forgotten_before) VALUES ($1, $2)
ON CONFLICT (consumer) DO UPDATE SET forgotten_before = excluded.forgotten_before
WHERE h.forgotten_before < excluded.forgotten_before`, h), []any{consumer, before.UTC()}
}

// HorizonSQL returns the later of consumer's row and the "" row.
func (d *Dialect) HorizonSQL(t dialect.Table, consumer string) (string, []any) {
	return fmt.Sprintf("SELECT %s FROM %s WHERE consumer IN ('', $1)", micros("max(forgotten_before)"), d.horizon(t)), []any{consumer}
}

// HorizonsSQL returns every row of the horizon table.
func (d *Dialect) HorizonsSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT consumer, %s FROM %s ORDER BY consumer", micros("forgotten_before"), d.horizon(t))
}

// HorizonClaimSQL returns the claim with the horizon folded in: INSERT …
// SELECT … WHERE NOT EXISTS (a horizon row after the fence) ON CONFLICT DO
// NOTHING, which affects one row when the claim is new and the horizon does
// not refuse it, none otherwise. A message with no event time (fence NULL)
// is never refused. The insert meets a concurrent duplicate on the primary
// key and waits for it, as ClaimSQL does. It is a plain statement, with no
// row to return: Postgres plans it about as fast as ClaimSQL, where a common
// table expression returning the horizon (HorizonClaimQuerySQL) costs the
// server markedly more on every claim when it is planned each time, as
// database/sql's unnamed statements are.
func (d *Dialect) HorizonClaimSQL(t dialect.Table, partitioned bool) string {
	cols, vals, fence := "consumer, message_key", "$1::text, $2::text", "$3"
	if partitioned {
		cols, vals, fence = "consumer, message_key, event_day", "$1::text, $2::text, $3::date", "$4"
	}
	return fmt.Sprintf(`INSERT INTO %[2]s (%[3]s) SELECT %[4]s
WHERE %[5]s::timestamptz IS NULL OR NOT EXISTS (SELECT FROM %[1]s WHERE consumer IN ('', $1::text) AND forgotten_before > %[5]s::timestamptz)
ON CONFLICT DO NOTHING`, d.horizon(t), quote(t), cols, vals, fence)
}

// HorizonClaimQuerySQL is HorizonClaimSQL as a query that also returns the
// horizon it read, for a statement prepared once and run many times (the
// pgx path prepares it per connection, so planning it is paid once): one
// row, the claims inserted (0 or 1) and the horizon (nullable microseconds
// since the Unix epoch). Its parameters are HorizonClaimSQL's.
func (d *Dialect) HorizonClaimQuerySQL(t dialect.Table, partitioned bool) string {
	cols, vals, fence := "consumer, message_key", "$1::text, $2::text", "$3"
	if partitioned {
		cols, vals, fence = "consumer, message_key, event_day", "$1::text, $2::text, $3::date", "$4"
	}
	return fmt.Sprintf(`WITH h AS (SELECT max(forgotten_before) AS fb FROM %[1]s WHERE consumer IN ('', $1::text)),
c AS (INSERT INTO %[2]s (%[3]s) SELECT %[4]s FROM h WHERE h.fb IS NULL OR %[5]s::timestamptz IS NULL OR h.fb <= %[5]s::timestamptz ON CONFLICT DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM c), %[6]s FROM h`, d.horizon(t), quote(t), cols, vals, fence, micros("h.fb"))
}

// FoldHorizonClaimSQL returns HorizonClaimQuerySQL with companion as one more
// data-modifying common table expression: companion's count, the claim's
// and the horizon. companion's parameters follow the fence.
func (d *Dialect) FoldHorizonClaimSQL(t dialect.Table, partitioned bool, companion string) string {
	if companion == "" {
		return ""
	}
	cols, vals, fence := "consumer, message_key", "$1::text, $2::text", "$3"
	if partitioned {
		cols, vals, fence = "consumer, message_key, event_day", "$1::text, $2::text, $3::date", "$4"
	}
	return fmt.Sprintf(`WITH h AS (SELECT max(forgotten_before) AS fb FROM %[1]s WHERE consumer IN ('', $1::text)),
companion AS (%[7]s RETURNING 1),
claim AS (INSERT INTO %[2]s (%[3]s) SELECT %[4]s FROM h WHERE h.fb IS NULL OR %[5]s::timestamptz IS NULL OR h.fb <= %[5]s::timestamptz ON CONFLICT DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM companion), (SELECT count(*) FROM claim), %[6]s FROM h`, d.horizon(t), quote(t), cols, vals, fence, micros("h.fb"), companion)
}

// OlderSnapshotsSQL counts the other sessions that may run a claim
// statement of t on a snapshot older than the transaction that last changed
// consumer's horizon row: sessions holding a lock on t or on its horizon
// table (a claim statement takes them before its snapshot, and keeps them
// until its transaction ends) whose backend_xmin is not newer than the
// row's xmin. age() compares the two transaction ids across wraparound; a
// frozen row (age at its maximum) has no older snapshot. Sessions that
// touch neither table — a long report elsewhere in the database — never
// hold a cleanup up.
func (d *Dialect) OlderSnapshotsSQL(t dialect.Table, consumer string) (string, []any) {
	return fmt.Sprintf(`SELECT count(DISTINCT a.pid) FROM %s h, pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
WHERE h.consumer = $1 AND a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL
  AND age(a.backend_xmin) >= age(h.xmin)
  AND l.locktype = 'relation' AND l.relation IN (to_regclass($2), to_regclass($3))`, d.horizon(t)), []any{consumer, quote(t), d.horizon(t)}
}
