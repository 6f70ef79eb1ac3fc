package dialect

import "context"

// Identifier is an optional interface of a [Dialect]. A dialect that
// implements it names the claim table a middleware talks to: the database
// server, the database on it and, where the database can tell, the
// incarnation of the table itself. The duplicate pre-check
// (idempotent.Seen) scopes its entries by that name together with the
// table and the consumer, so that two middlewares with one consumer name on
// different servers, databases or tables never answer for each other, and
// so that an event that gives the database a new name — a Postgres
// point-in-time restore or failover, which starts a new timeline; a claim
// table dropped and restored from a dump — starts the pre-check afresh
// (which costs only cache misses).
//
// Identity reads the name through q, on a connection of the middleware's
// pool, outside any transaction of a delivery: one or two cheap, read-only
// queries, once per middleware. The name must be the same on every
// connection that reaches the same table, and must differ between tables
// that are not the same one. Identity returns an error when it cannot tell
// (the table does not exist yet, the server hides what it needs, the
// database has no stable name such as an in-memory SQLite): the middleware
// then leaves the pre-check out rather than share a scope with anyone.
//
// A dialect without Identifier gets no pre-check: idempotent.New refuses
// WithSeen with it.
type Identifier interface {
	Identity(ctx context.Context, t Table, q QueryFunc) (string, error)
}
