package sqlite

import (
	"fmt"
	"strconv"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Orderer = (*Dialect)(nil)

// MaxOrderKeyBytes is the longest ordering key the SQLite dialect
// accepts, the same on every dialect.
const MaxOrderKeyBytes = 512

// orderSyntax is the SQLite syntax of the ordering statements
// (dialect.OrderSQL). SQLite has no FOR UPDATE and needs none: it runs one
// writing transaction at a time, and the middleware reads the sequence row
// only after a write of the same transaction (the claim), so the
// transaction already holds the database's write lock.
type orderSyntax struct{}

// OrderTables returns t's sequence table, t's name + "_order_seq", and
// parking table, t's name + "_order_parked", in t's (attached) database.
func (orderSyntax) OrderTables(t dialect.Table) (seq, parked dialect.Table) {
	return dialect.Table{Schema: t.Schema, Name: t.Name + "_order_seq"},
		dialect.Table{Schema: t.Schema, Name: t.Name + "_order_parked"}
}

func (orderSyntax) Quote(t dialect.Table) string       { return quote(t) }
func (orderSyntax) Placeholder(i int) string           { return "?" + strconv.Itoa(i) }
func (orderSyntax) ForUpdate() string                  { return "" }
func (orderSyntax) OnConflict() string                 { return " ON CONFLICT DO NOTHING" }
func (orderSyntax) EmptyBytes() string                 { return "X''" }
func (orderSyntax) Upsert() (ok bool, greatest string) { return true, "max" }

// MaxOrderKeyBytes returns [MaxOrderKeyBytes].
func (*Dialect) MaxOrderKeyBytes() int { return MaxOrderKeyBytes }

// OrderSchemaSQL returns the sequence table and the parking table.
func (d *Dialect) OrderSchemaSQL(t dialect.Table) []string {
	s, p := d.OrderTables(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer   TEXT    NOT NULL,
	order_key  TEXT    NOT NULL,
	last_seq   INTEGER NOT NULL,
	parked_max INTEGER NOT NULL,
	PRIMARY KEY (consumer, order_key)
) WITHOUT ROWID`, quote(s)),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer      TEXT   NOT NULL,
	order_key     TEXT   NOT NULL,
	seq           INTEGER NOT NULL,
	state         TEXT   NOT NULL,
	message_key   TEXT   NOT NULL,
	payload       BLOB  NOT NULL,
	headers       TEXT   NOT NULL,
	event_time_us INTEGER NOT NULL,
	parked_at_us  INTEGER NOT NULL,
	PRIMARY KEY (consumer, order_key, seq)
) WITHOUT ROWID`, quote(p)),
	}
}

// ClaimSQL is "": SQLite runs no INSERT in a WITH clause.
func (orderSyntax) ClaimSQL(dialect.Table) string { return "" }
