package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.ServerChecker = (*Dialect)(nil)

// versionSQL is the query CheckServer runs.
const versionSQL = "SELECT version()"

// CheckServer asks for version() and requires a server that calls itself
// PostgreSQL (or CockroachDB, which speaks the same SQL for the claim).
// MySQL answers with a bare version number such as "10.11.6-MariaDB", and
// SQLite has no version() function; both give an error wrapping
// dialect.ErrWrongDatabase.
func (d *Dialect) CheckServer(ctx context.Context, _ dialect.Table, q dialect.QueryFunc) error {
	v, err := q(ctx, versionSQL)
	if err != nil {
		if d.Classify(err).Retryable() {
			return err
		}
		return fmt.Errorf("postgres dialect: %w: %s failed, so the server is not PostgreSQL (is the *sql.DB opened with another driver?): %w", dialect.ErrWrongDatabase, versionSQL, err)
	}
	if !strings.HasPrefix(v, "PostgreSQL") && !strings.HasPrefix(v, "CockroachDB") {
		if i := strings.IndexByte(v, '\n'); i >= 0 {
			v = v[:i]
		}
		return fmt.Errorf("postgres dialect: %w: the server says it is %q, not PostgreSQL (is the *sql.DB opened with another driver?)", dialect.ErrWrongDatabase, v)
	}
	return nil
}
