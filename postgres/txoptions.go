package postgres

import (
	"database/sql"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.TxOptionsChecker = (*Dialect)(nil)

// CheckTxOptions accepts the isolation levels Postgres has and both lib/pq
// and pgx's stdlib can begin — sql.LevelDefault, LevelReadUncommitted (which
// Postgres runs as read committed), LevelReadCommitted, LevelRepeatableRead
// and LevelSerializable — and refuses the others: LevelWriteCommitted and
// LevelLinearizable, which no driver begins, and LevelSnapshot, which lib/pq
// refuses at every BeginTx and pgx quietly runs as repeatable read. A
// read-only transaction cannot insert a claim.
func (*Dialect) CheckTxOptions(o sql.TxOptions) error {
	if o.ReadOnly {
		return fmt.Errorf("postgres dialect: a read-only transaction cannot insert a claim")
	}
	switch o.Isolation {
	case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		return nil
	}
	return fmt.Errorf("postgres dialect: isolation level %v is not supported by Postgres (use Default, Read Uncommitted, Read Committed, Repeatable Read or Serializable)", o.Isolation)
}
