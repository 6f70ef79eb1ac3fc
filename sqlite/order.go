package sqlite

import (
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Orderer = (*Dialect)(nil)

// MaxOrderKeyBytes is the longest ordering key the SQLite dialect
// accepts, the same on every dialect.
const MaxOrderKeyBytes = 512

// OrderTables returns t's sequence table, t's name + "_order_seq", and
// parking table, t's name + "_order_parked", in t's (attached) database.
func (*Dialect) OrderTables(t dialect.Table) (seq, parked dialect.Table) {
	return dialect.Table{Schema: t.Schema, Name: t.Name + "_order_seq"},
		dialect.Table{Schema: t.Schema, Name: t.Name + "_order_parked"}
}

func (d *Dialect) orderTables(t dialect.Table) (seq, parked string) {
	s, p := d.OrderTables(t)
	return quote(s), quote(p)
}

func (d *Dialect) order(t dialect.Table) dialect.OrderStatements {
	s, p := d.orderTables(t)
	return dialect.OrderStatements{Seq: s, Parked: p, Claims: quote(t), Placeholder: func(int) string { return "?" }, ForUpdate: ""}
}

// MaxOrderKeyBytes returns [MaxOrderKeyBytes].
func (*Dialect) MaxOrderKeyBytes() int { return MaxOrderKeyBytes }

// OrderSchemaSQL returns the sequence table and the parking table.
func (d *Dialect) OrderSchemaSQL(t dialect.Table) []string {
	s, p := d.orderTables(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer  TEXT   NOT NULL,
	order_key TEXT   NOT NULL,
	last_seq  INTEGER NOT NULL,
	PRIMARY KEY (consumer, order_key)
) WITHOUT ROWID`, s),
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
) WITHOUT ROWID`, p),
	}
}

// OrderRowSQL inserts the sequence row with ON CONFLICT DO NOTHING.
func (d *Dialect) OrderRowSQL(t dialect.Table) string {
	s, _ := d.orderTables(t)
	return fmt.Sprintf("INSERT INTO %s (consumer, order_key, last_seq) VALUES (?, ?, 0) ON CONFLICT DO NOTHING", s)
}

// OrderLockSQL reads last_seq. SQLite has no FOR UPDATE and needs none: it
// runs one writing transaction at a time, and the middleware reads the row
// only after a write of the same transaction (the claim, or OrderRowSQL),
// so the transaction already holds the database's write lock.
func (d *Dialect) OrderLockSQL(t dialect.Table) string { return d.order(t).Lock() }

// OrderBumpSQL sets last_seq.
func (d *Dialect) OrderBumpSQL(t dialect.Table) string { return d.order(t).Bump() }

// ParkSQL inserts a parked message with ON CONFLICT DO NOTHING.
func (d *Dialect) ParkSQL(t dialect.Table) string {
	o := d.order(t)
	return "INSERT INTO " + o.Parked + " " + o.Park() + " ON CONFLICT DO NOTHING"
}

// SkipSQL inserts a tombstone with ON CONFLICT DO NOTHING.
func (d *Dialect) SkipSQL(t dialect.Table) string {
	o := d.order(t)
	return "INSERT INTO " + o.Parked + " " + o.Skip("X''") + " ON CONFLICT DO NOTHING"
}

// ParkedSQL reads the row of one sequence.
func (d *Dialect) ParkedSQL(t dialect.Table) string { return d.order(t).ParkedOne() }

// UnparkSQL deletes the parked message of one sequence.
func (d *Dialect) UnparkSQL(t dialect.Table) string { return d.order(t).Unpark() }

// WaitingSQL lists the entities with parked messages.
func (d *Dialect) WaitingSQL(t dialect.Table) string { return d.order(t).Waiting() }

// ParkedRowsSQL lists one entity's parked messages in sequence order.
func (d *Dialect) ParkedRowsSQL(t dialect.Table) string { return d.order(t).ParkedRows() }

// UnclaimSQL deletes one claim.
func (d *Dialect) UnclaimSQL(t dialect.Table) string { return d.order(t).Unclaim() }
