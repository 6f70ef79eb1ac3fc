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
package postgres
