package postgres

import (
	"fmt"
	"strconv"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Orderer = (*Dialect)(nil)

// MaxOrderKeyBytes is the longest ordering key the Postgres dialect
// accepts, the same on every dialect.
const MaxOrderKeyBytes = 512

// orderSyntax is the Postgres syntax of the ordering statements
// (dialect.OrderSQL).
type orderSyntax struct{}

// OrderTables returns t's sequence table, t's name + "_order_seq", and
// parking table, t's name + "_order_parked", in t's schema (shortened with
// a hash as HorizonName is, when too long).
func (orderSyntax) OrderTables(t dialect.Table) (seq, parked dialect.Table) {
	return dialect.Table{Schema: t.Schema, Name: suffixed(t.Name, "_order_seq")},
		dialect.Table{Schema: t.Schema, Name: suffixed(t.Name, "_order_parked")}
}

func (orderSyntax) Quote(t dialect.Table) string       { return quote(t) }
func (orderSyntax) Placeholder(i int) string           { return "$" + strconv.Itoa(i) }
func (orderSyntax) ForUpdate() string                  { return " FOR UPDATE" }
func (orderSyntax) OnConflict() string                 { return " ON CONFLICT DO NOTHING" }
func (orderSyntax) EmptyBytes() string                 { return "''::bytea" }
func (orderSyntax) Upsert() (ok bool, greatest string) { return true, "GREATEST" }

// MaxOrderKeyBytes returns [MaxOrderKeyBytes].
func (*Dialect) MaxOrderKeyBytes() int { return MaxOrderKeyBytes }

// OrderSchemaSQL returns the sequence table and the parking table.
func (d *Dialect) OrderSchemaSQL(t dialect.Table) []string {
	s, p := d.OrderTables(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer   text   NOT NULL,
	order_key  text   NOT NULL,
	last_seq   bigint NOT NULL,
	parked_max bigint NOT NULL,
	PRIMARY KEY (consumer, order_key)
)`, quote(s)),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer      text   NOT NULL,
	order_key     text   NOT NULL,
	seq           bigint NOT NULL,
	state         text   NOT NULL,
	message_key   text   NOT NULL,
	payload       bytea  NOT NULL,
	headers       text   NOT NULL,
	event_time_us bigint NOT NULL,
	parked_at_us  bigint NOT NULL,
	PRIMARY KEY (consumer, order_key, seq)
)`, quote(p)),
	}
}

// ClaimSQL is the Dialect's: the claim may run in a WITH clause.
func (orderSyntax) ClaimSQL(t dialect.Table) string { return (*Dialect)(nil).ClaimSQL(t) }
