package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.TxOptionsChecker = (*Dialect)(nil)

// CheckTxOptions accepts sql.LevelDefault and LevelSerializable, and
// refuses every other isolation level: SQLite transactions are always
// serializable, and modernc.org/sqlite ignores the level it is given, so a
// weaker level would be asked for and never run. A read-only transaction
// cannot insert a claim (the driver would also begin it without the
// write lock _txlock=immediate takes).
//
// SQLite needs no dialect.ImplicitCommitter: its DDL is transactional, and
// the statements that cannot run in a transaction (VACUUM, a nested BEGIN)
// fail there instead of committing it.
func (*Dialect) CheckTxOptions(o sql.TxOptions) error {
	if o.ReadOnly {
		return fmt.Errorf("sqlite dialect: a read-only transaction cannot insert a claim")
	}
	switch o.Isolation {
	case sql.LevelDefault, sql.LevelSerializable:
		return nil
	}
	return fmt.Errorf("sqlite dialect: isolation level %v is not supported: SQLite transactions are always serializable and modernc.org/sqlite ignores the level (use Default or Serializable)", o.Isolation)
}
