package mysql

import (
	"fmt"
	"hash/fnv"
	"io"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.HorizonKeeper = (*Dialect)(nil)

// MaxIdentifierLength is the longest table name MySQL and MariaDB accept:
// 64 characters.
const MaxIdentifierLength = 64

// HorizonName returns the name of the horizon table of the claim table name
// (unqualified, unquoted): name + "_horizon" when that fits in
// [MaxIdentifierLength], else a prefix of name, a hash of the whole name and
// the suffix, so two long names sharing a prefix never share a horizon.
func HorizonName(name string) string { return suffixed(name, "_horizon") }

// suffixed returns name + suffix when that fits in [MaxIdentifierLength],
// else a prefix of name, a hash of the whole name and the suffix.
func suffixed(name, suffix string) string {
	if len(name)+len(suffix) <= MaxIdentifierLength {
		return name + suffix
	}
	h := fnv.New32a()
	_, _ = io.WriteString(h, name)
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return name[:MaxIdentifierLength-len(suffix)-len(tag)] + tag + suffix
}

// HorizonTable returns t's horizon table, HorizonName(t.Name) in t's
// database.
func (*Dialect) HorizonTable(t dialect.Table) dialect.Table {
	return dialect.Table{Schema: t.Schema, Name: HorizonName(t.Name)}
}

func (d *Dialect) horizon(t dialect.Table) string { return quote(d.HorizonTable(t)) }

// HorizonSchemaSQL returns the horizon table, an InnoDB table with one row
// per consumer ("" for every consumer). consumer is VARBINARY(128), as in
// the claim table; forgotten_before is a DATETIME(6) in UTC, as
// processed_at is.
func (d *Dialect) HorizonSchemaSQL(t dialect.Table) []string {
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer         VARBINARY(128) NOT NULL,
	forgotten_before DATETIME(6)    NOT NULL,
	PRIMARY KEY (consumer)
) ENGINE=InnoDB`, d.horizon(t))}
}

// CleanupRow is the consumer column of the horizon table's cleanup row, a
// name no consumer can have (see AdvanceHorizonSQL). HorizonsSQL leaves it
// out.
const CleanupRow = "#cleanup"

// AdvanceHorizonSQL returns an upsert that only ever raises consumer's
// row: GREATEST of the stored and the new time. before is rounded up to the
// microsecond. The same statement moves the table's cleanup row
// (CleanupRow) on by a microsecond, a real change every time: every
// cleanup batch, which raises the horizon in its transaction, writes that
// row. On a Galera cluster, where the cleanup lock (GET_LOCK) is held on
// one node only, two batches running at once on two nodes both write it,
// and certification lets one commit and aborts the other (error 1213,
// retried by the retry policy after the first committed): batches of one
// claim table commit one at a time across the cluster, as the lock makes
// them on one server. Parameters: consumer, before, before.
func (d *Dialect) AdvanceHorizonSQL(t dialect.Table, consumer string, before time.Time) (string, []any) {
	b := timeArg(before)
	return fmt.Sprintf("INSERT INTO %s (consumer, forgotten_before) VALUES (?, ?), ('%s', '1970-01-01 00:00:01') ON DUPLICATE KEY UPDATE forgotten_before = IF(consumer = '%s', forgotten_before + INTERVAL 1 MICROSECOND, GREATEST(forgotten_before, ?))",
		d.horizon(t), CleanupRow, CleanupRow), []any{consumer, b, b}
}

// HorizonSQL returns the later of consumer's row and the "" row, read with
// LOCK IN SHARE MODE (which MySQL 8 and MariaDB both accept). A locking
// read sees the rows as last committed, whatever the transaction read
// before and at every isolation level, where a plain (consistent) read
// under REPEATABLE READ would see them as of the transaction's first
// consistent read — in a coalesced group, before the handlers of the
// members claimed earlier ran. The middleware runs it after a claim that
// inserted: the insert can only succeed over a claim a cleanup deleted
// once that cleanup committed, and the cleanup raised the horizon in a
// transaction it committed before, so the read sees the raise. Its shared
// locks last until the claim's transaction ends; a cleanup raising the
// horizon meanwhile waits for it, which is all the ordering it needs.
func (d *Dialect) HorizonSQL(t dialect.Table, consumer string) (string, []any) {
	return fmt.Sprintf("SELECT %s FROM %s WHERE consumer IN ('', ?) LOCK IN SHARE MODE", micros("MAX(forgotten_before)"), d.horizon(t)), []any{consumer}
}

// HorizonsSQL returns every consumer's row of the horizon table (not the
// cleanup row, CleanupRow).
func (d *Dialect) HorizonsSQL(t dialect.Table) string {
	return fmt.Sprintf("SELECT consumer, %s FROM %s WHERE consumer <> '%s' ORDER BY consumer", micros("forgotten_before"), d.horizon(t), CleanupRow)
}
