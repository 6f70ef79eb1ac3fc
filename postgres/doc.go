// Package postgres is the Postgres dialect of the idempotent middleware,
// built on github.com/lib/pq for identifier quoting and tested with both
// lib/pq and pgx's database/sql driver.
//
// The claim is the guide's INSERT … ON CONFLICT DO NOTHING on a table keyed
// by (consumer, message_key). Serialization failures (40001) and deadlocks
// (40P01) are retried by the middleware, as are lost connections (class 08,
// 57P01–57P03): even a connection lost during COMMIT is safe to retry,
// because if the commit did land, the retried claim finds the row and
// reports a duplicate. A lock timeout (55P03) becomes idempotent.ErrClaimBusy.
//
// Every lock and setting the dialect takes is transaction-scoped (SET LOCAL,
// pg_advisory_xact_lock), so it works behind PgBouncer in transaction mode;
// see docs/deployment.md for the driver settings that needs.
//
// A commit acknowledged before a standby has it is lost if the standby is
// promoted: [CheckReplication] reports, at start-up, whether that can happen
// on the consumers' connection (synchronous_commit,
// synchronous_standby_names, pg_stat_replication), and its
// [ReplicationReport.Err] refuses what it cannot confirm.
package postgres
