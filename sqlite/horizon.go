package sqlite

import (
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.HorizonKeeper = (*Dialect)(nil)

// HorizonTable returns t's horizon table: t's name with the suffix
// "_horizon", in t's (attached) database. SQLite has no identifier length
// limit to make room for.
func (*Dialect) HorizonTable(t dialect.Table) dialect.Table {
	return dialect.Table{Schema: t.Schema, Name: t.Name + "_horizon"}
}

func (d *Dialect) horizon(t dialect.Table) string { return quote(d.HorizonTable(t)) }

// HorizonSchemaSQL returns the horizon table, one row per consumer ("" for
// every consumer), stored WITHOUT ROWID like the claim table.
// forgotten_before is text in processed_at's format (see CleanupBatchSQL),
// so that the rows read as times in SQLite's date functions.
func (d *Dialect) HorizonSchemaSQL(t dialect.Table) []string {
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer         TEXT NOT NULL PRIMARY KEY,
	forgotten_before TEXT NOT NULL
) WITHOUT ROWID`, d.horizon(t))}
}

// AdvanceHorizonSQL returns an upsert that only ever raises the row: the
// stored text is replaced only by a later time (the format compares as the
// times do). before is rounded up to the microsecond. Parameters: ?1
// consumer, ?2 before.
func (d *Dialect) AdvanceHorizonSQL(t dialect.Table, consumer string, before time.Time) (string, []any) {
	return fmt.Sprintf("INSERT INTO %s (consumer, forgotten_before) VALUES (?1, ?2) ON CONFLICT (consumer) DO UPDATE SET forgotten_before = excluded.forgotten_before WHERE excluded.forgotten_before > forgotten_before",
		d.horizon(t)), []any{consumer, timeText(before)}
}

// HorizonSQL returns the later of consumer's row and the "" row. A
// transaction of a connection opened by [Open] holds the write lock from
// BEGIN, so nothing commits between its claim and this read.
func (d *Dialect) HorizonSQL(t dialect.Table, consumer string) (string, []any) {
	return fmt.Sprintf("SELECT %s FROM (SELECT max(forgotten_before) AS fb FROM %s WHERE consumer IN ('', ?1))", micros("fb"), d.horizon(t)), []any{consumer}
}

// HorizonsSQL returns every row of the horizon table.
func (d *Dialect) HorizonsSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT consumer, %s FROM %s ORDER BY consumer", micros("forgotten_before"), d.horizon(t))
}
