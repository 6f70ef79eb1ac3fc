package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.ServerChecker = (*Dialect)(nil)

// ErrPooledPreparedStatement is wrapped by CheckServer (and so by
// EnsureSchema) when the server says a prepared statement the driver relies
// on does not exist (SQLSTATE 26000) or already exists (42P05): the driver
// caches prepared statements per connection, and a pooler in transaction
// mode, such as PgBouncer, runs each transaction on whichever server
// connection is free. Use pgx's default_query_exec_mode=exec (or
// simple_protocol) and lib/pq's binary_parameters=yes behind such a pooler;
// see docs/deployment.md.
var ErrPooledPreparedStatement = errors.New("the driver's prepared statements do not match the server connection (a transaction-mode pooler in between?)")

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
		if c := d.Classify(err).Code; c == "26000" || c == "42P05" {
			return fmt.Errorf("postgres dialect: %w: %s failed: %w; behind PgBouncer in transaction mode set pgx's default_query_exec_mode=exec or lib/pq's binary_parameters=yes", ErrPooledPreparedStatement, versionSQL, err)
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
