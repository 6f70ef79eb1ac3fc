package postgres

import (
	"context"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Identifier = (*Dialect)(nil)

// identitySQL names the claim table: the cluster's system identifier (set
// by initdb, shared by its physical replicas and by every copy of its
// files), the timeline the server writes WAL on, the server's start time
// in microseconds since 1970 (pg_postmaster_start_time(): set when the
// server starts, kept by nothing a backup or a copy holds), the table's
// OID and storage (pg_relation_filenode(), 0 for a partitioned table) and
// the database's OID and name. $1 is the table's quoted name, resolved as
// the claim statement resolves it (by the session's search_path when it
// has no schema); the row's value is NULL when the table does not exist.
// Nothing in it depends on the session's settings (TimeZone, DateStyle).
//
// The timeline is the one of the WAL insert position, not
// pg_control_checkpoint()'s: after a promotion that one still names the
// old timeline until the next checkpoint completes, which may take
// minutes. pg_current_wal_lsn() fails on a standby, which can hold no
// claim anyway.
const identitySQL = "SELECT 'postgres system ' || s.system_identifier" +
	" || ' timeline ' || ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint" +
	" || ' start ' || (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint" +
	" || ' table ' || to_regclass($1)::oid" +
	" || ' storage ' || COALESCE(pg_relation_filenode(to_regclass($1)), 0)" +
	" || ' database ' || d.oid || ' ' || d.datname" +
	" FROM pg_control_system() s, pg_database d WHERE d.datname = current_database()"

// Identity names the claim table t for the duplicate pre-check with one
// query: "postgres system <system identifier> timeline <timeline> start
// <server start, microseconds since 1970> table <table OID> storage
// <relfilenode> database <database OID> <database name>".
//
// The name changes whenever the database could have lost claims that a
// pre-check remembers, because every such event starts a server or
// re-creates the table:
//
//   - A restart starts a server: a new start time. So does a pg_upgrade,
//     and every way to put back a cluster's files: a base backup or a
//     volume snapshot started as it is (crash recovery from its backup
//     label or its WAL, which keeps the system identifier, the timeline
//     and every OID), a point-in-time recovery. A point-in-time recovery
//     and a promotion also start a new timeline.
//   - A physical clone (a replica promoted, or a base backup started as a
//     staging server) shares the system identifier and the OIDs, but has
//     a start time of its own: it never shares a scope with the original.
//   - A database dropped and re-created, or a claim table dropped and
//     restored from a dump (pg_restore --clean), gets a new OID; a claim
//     table emptied with TRUNCATE (before loading a dump's data back into
//     it, say) gets new storage. A partitioned claim table has no storage
//     of its own: TRUNCATE of it changes nothing, nor do claims deleted by
//     hand — clear the pre-check then (see idempotent.Seen).
//   - Another cluster has another system identifier; another database,
//     another table (a tenant's schema found by search_path, say) another
//     OID.
//
// Each gives a new scope, so entries recorded before it are not consulted
// after it, once the middleware has read the name again (see
// idempotent.Middleware.SeenScope). The pre-check is therefore cold after
// every server restart, and after a VACUUM FULL or CLUSTER of the claim
// table, which give it new storage.
//
// The crash of one backend process (a segfault, the OOM killer taking a
// backend) is not a restart: the postmaster runs crash recovery and keeps
// its start time, so the name stays. That loses no committed claim, unless
// claims commit with synchronous_commit = off, which can lose the last
// acknowledged ones there while the pre-check still knows them: do not run
// claims with it.
//
// pg_control_system(), pg_walfile_name(), pg_current_wal_lsn(),
// pg_postmaster_start_time() and pg_relation_filenode() are open to every
// role by default. A server that refuses one (a standby, a role whose
// EXECUTE was revoked, a Postgres-compatible database without them) gets
// an error, and the middleware leaves the pre-check out.
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
