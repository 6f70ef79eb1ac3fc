// Package postgres is the Postgres dialect of the idempotent middleware,
// built on github.com/lib/pq for identifier quoting and tested with both
// lib/pq and pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib).
//
//	connector, err := pq.NewConnector(dsn)
//	db := sql.OpenDB(idempotent.GuardConnector(connector))
//	mw, err := idempotent.New(db, postgres.New(), "loyalty")
//	err = mw.EnsureSchema(ctx)
//
// # The claim
//
// The claim is the guide's INSERT … ON CONFLICT DO NOTHING, with no conflict
// target (so the consumer's role needs INSERT on the claim table, not
// SELECT), on a table keyed by (consumer, message_key), message_key text of
// at most [MaxKeyBytes] bytes, with a processed_at timestamptz column and
// index for cleanup. [Dialect.SchemaSQL] returns the DDL; the golden files
// under testdata hold every statement this package writes (go test
// ./postgres -update rewrites them after an intended change).
//
// # Errors
//
// Serialization failures (40001) and deadlocks (40P01) are retried by the
// middleware, as are lost connections (class 08, 57P01–57P03, and the
// drivers' bad-connection and network errors) and a failover's standbys
// (25006, a standby's 0A000 refusal of BEGIN READ WRITE, a multi-host
// connection string finding no writable host; see [Dialect.Classify]):
// even a connection lost
// during COMMIT is safe to retry, because if the commit did land, the
// retried claim finds the row and reports a duplicate. A lock timeout
// (55P03) becomes idempotent.ErrClaimBusy and a missing table (42P01)
// idempotent.ErrNoClaimTable. Errors are found with errors.As on
// interface{ SQLState() string }, so *pq.Error and *pgconn.PgError both
// work without this package importing pgx.
//
// # Everything the middleware can ask of a dialect
//
// The Postgres dialect implements every optional interface of package
// dialect:
//
//   - WithLockTimeout: SET LOCAL lock_timeout, for the claim's transaction;
//   - WithStrictGuard: txid_current() after the claim and before COMMIT;
//   - EnsureSchema's server check (version() must be PostgreSQL) and an
//     advisory lock against concurrent creation;
//   - the batch claim: one INSERT … SELECT over unnest of a text array,
//     RETURNING the new keys;
//   - batched Cleanup: pg_try_advisory_xact_lock on the table's OID, SET
//     LOCAL statement_timeout, and DELETE … WHERE ctid = ANY (ARRAY(SELECT
//     ctid … LIMIT n));
//   - daily partitions: PARTITION BY RANGE (event_day), created ahead and
//     detached then dropped by MaintainPartitions; a claim with no partition
//     for its day (23514) becomes idempotent.ErrBeyondRetention;
//   - the version-guarded upsert of dialect.NewVersionedUpsert.
//
// # Deployment
//
// Every lock and setting the dialect takes is transaction-scoped (SET LOCAL,
// pg_advisory_xact_lock), so it works behind PgBouncer in transaction mode;
// see docs/deployment.md for the driver settings that needs. A driver's
// prepared-statement cache broken by such a pooler fails EnsureSchema with
// [ErrPooledPreparedStatement].
//
// A commit acknowledged before a standby has it is lost if the standby is
// promoted: [CheckReplication] reports, at start-up, whether that can happen
// on the consumers' connection (synchronous_commit,
// synchronous_standby_names, pg_stat_replication), and its
// [ReplicationReport.Err] refuses what it cannot confirm.
package postgres
