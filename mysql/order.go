package mysql

import (
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Orderer = (*Dialect)(nil)

// MaxOrderKeyBytes is the longest ordering key the MySQL dialect
// accepts, the same on every dialect.
const MaxOrderKeyBytes = 512

// orderSyntax is the MySQL syntax of the ordering statements
// (dialect.OrderSQL). MySQL has no INSERT … RETURNING, so
// OrderAdvanceSQL is "" and the middleware locks the sequence row with
// SELECT … FOR UPDATE.
type orderSyntax struct{}

// OrderTables returns t's sequence table, t's name + "_order_seq", and
// parking table, t's name + "_order_parked", in t's schema (shortened with
// a hash as HorizonName is, when too long).
func (orderSyntax) OrderTables(t dialect.Table) (seq, parked dialect.Table) {
	return dialect.Table{Schema: t.Schema, Name: suffixed(t.Name, "_order_seq")},
		dialect.Table{Schema: t.Schema, Name: suffixed(t.Name, "_order_parked")}
}

func (orderSyntax) Quote(t dialect.Table) string { return quote(t) }
func (orderSyntax) Placeholder(int) string       { return "?" }
func (orderSyntax) ForUpdate() string            { return " FOR UPDATE" }

// OnConflict updates a column to itself, which unlike INSERT IGNORE turns
// no other error into a warning.
func (orderSyntax) OnConflict() string                 { return " ON DUPLICATE KEY UPDATE consumer = consumer" }
func (orderSyntax) EmptyBytes() string                 { return "''" }
func (orderSyntax) Upsert() (ok bool, greatest string) { return false, "" }

// MaxOrderKeyBytes returns [MaxOrderKeyBytes].
func (*Dialect) MaxOrderKeyBytes() int { return MaxOrderKeyBytes }

// OrderSchemaSQL returns the sequence table and the parking table, InnoDB
// tables whose keys are VARBINARY like the claim table's (byte comparison);
// headers are kept as bytes, whatever the server's default character set.
func (d *Dialect) OrderSchemaSQL(t dialect.Table) []string {
	s, p := d.OrderTables(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer   VARBINARY(128) NOT NULL,
	order_key  VARBINARY(%d) NOT NULL,
	last_seq   BIGINT         NOT NULL,
	parked_max BIGINT         NOT NULL,
	PRIMARY KEY (consumer, order_key)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`, quote(s), MaxOrderKeyBytes),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer      VARBINARY(128)  NOT NULL,
	order_key     VARBINARY(%d)  NOT NULL,
	seq           BIGINT          NOT NULL,
	state         CHAR(1)         NOT NULL,
	message_key   VARBINARY(%d) NOT NULL,
	payload       LONGBLOB        NOT NULL,
	headers       LONGBLOB        NOT NULL,
	event_time_us BIGINT          NOT NULL,
	parked_at_us  BIGINT          NOT NULL,
	PRIMARY KEY (consumer, order_key, seq)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`, quote(p), MaxOrderKeyBytes, MaxKeyBytes),
	}
}

// ClaimSQL is "": MySQL runs no INSERT in a WITH clause.
func (orderSyntax) ClaimSQL(dialect.Table) string { return "" }
