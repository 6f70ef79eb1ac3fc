// Package seenredis is a duplicate pre-check for the idempotent middleware
// kept in Redis: pass a *Seen to idempotent.WithSeen (or idempgx.WithSeen),
// and a redelivery of a message whose claim committed is answered as a
// duplicate by one Redis round trip, without a database transaction.
//
// The pre-check can only make a duplicate cheaper. A key is written only
// after its claim committed, with a time to live of the middleware's
// retention window, so it never outlives the claim; a missing key, an
// evicted one, a Redis that is down or slow (beyond WithTimeout) all send
// the delivery to the claim in the database, which decides as it always
// does.
//
// Keys are scoped by the Middleware's idempotent.SeenScope — the claim
// table's database as its dialect names it, with the start of the server
// holding it, the table and the consumer — hashed into a tag after the key
// prefix (see Seen.Key). Middlewares of one consumer name on different
// databases or tables can therefore share one Redis, with the default
// prefix or any other: tenants, a database/sql and a pgx Middleware on
// different tables. The scope changes whenever the database's server
// starts, so a restored or cloned database never finds the entries of the
// original; that keeps apart environments that share a Redis by mistake,
// but give each environment (staging, production) its own Redis or its
// own WithPrefix all the same. A Middleware whose database cannot be named
// consults no pre-check at all.
//
// A Duplicate from Redis is safe only where the message was already
// settled at the broker; for what a restart, a restore or a failover of
// the claim database does to the scope, and what to clear when it does
// not change it, see idempotent.Seen and docs/operations.md ("Pre-check
// and restores").
package seenredis
