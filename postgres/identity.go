package postgres

import (
	"context"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Identifier = (*Dialect)(nil)

// identitySQL names the claim table: the cluster's system identifier (set
// by initdb, shared by its physical replicas), the timeline the server
// writes WAL on, the table's OID and the database's OID and name. $1 is the
// table's quoted name, resolved as the claim statement resolves it (by the
// session's search_path when it has no schema); the row's value is NULL
// when the table does not exist.
//
// The timeline is the one of the WAL insert position, not
// pg_control_checkpoint()'s: after a promotion that one still names the
// old timeline until the next checkpoint completes, which may take
// minutes. pg_current_wal_lsn() fails on a standby, which can hold no
// claim anyway.
const identitySQL = "SELECT 'postgres system ' || s.system_identifier" +
	" || ' timeline ' || ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint" +
	" || ' table ' || to_regclass($1)::oid" +
	" || ' database ' || d.oid || ' ' || d.datname" +
	" FROM pg_control_system() s, pg_database d WHERE d.datname = current_database()"

// Identity names the claim table t for the duplicate pre-check with one
// query: "postgres system <system identifier> timeline <timeline> table
// <table OID> database <database OID> <database name>".
//
//   - Another cluster has another system identifier; another database,
//     another table (a tenant's schema found by search_path, say) another
//     OID: none shares a scope.
//   - A point-in-time restore, a restore from a base backup and a
//     promotion all start a new timeline; a database dropped and
//     re-created, or a claim table dropped and restored from a dump, gets
//     a new OID. Each gives a new scope, so entries recorded before it are
//     not consulted after it (once the middleware has read the name again,
//     which a running process does not do: see idempotent.Seen).
//   - A physical replica shares the system identifier and the OIDs, and
//     reaches its own timeline only when promoted: until then it cannot
//     hold claims.
//
// pg_control_system(), pg_walfile_name() and pg_current_wal_lsn() are open
// to every role by default. A server that refuses one (a standby, a role
// whose EXECUTE was revoked, a Postgres-compatible database without them)
// gets an error, and the middleware leaves the pre-check out.
func (d *Dialect) Identity(ctx context.Context, t dialect.Table, q dialect.QueryFunc) (string, error) {
	id, err := q(ctx, identitySQL, quote(t))
	if err != nil {
		return "", fmt.Errorf("postgres dialect: read the identity of %s: %w", t, err)
	}
	if id == "" {
		return "", fmt.Errorf("postgres dialect: read the identity of %s: the table does not exist (run EnsureSchema first)", t)
	}
	return id, nil
}
