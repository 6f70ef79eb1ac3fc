package dialect

import "database/sql"

// TxOptionsChecker is an optional interface of a [Dialect] that knows which
// transaction options its drivers and database can run.
// idempotent.New calls it with the options given to WithTxOptions, so that
// a level the driver would refuse at every BeginTx (or silently replace by
// another) is an error from New instead of a failure at every message.
type TxOptionsChecker interface {
	// CheckTxOptions returns nil if transactions begun with o can run a
	// claim, and otherwise an error naming the dialect and what it cannot
	// run. A read-only transaction can never insert a claim.
	CheckTxOptions(o sql.TxOptions) error
}
