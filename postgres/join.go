package postgres

import (
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.StatementJoiner = (*Dialect)(nil)

// JoinSQL returns stmts separated by semicolons: one query string, which
// lib/pq and pgx's stdlib send without arguments in the simple query
// protocol, where the server runs its statements in order and stops at the
// first that fails.
func (*Dialect) JoinSQL(stmts ...string) string { return strings.Join(stmts, "; ") }
