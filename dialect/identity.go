package dialect

import "context"

// Identifier is an optional interface of a [Dialect]. A dialect that
// implements it names the claim table a middleware talks to: the database
// server and its start, the database on it and, where the database can
// tell, the incarnation of the table itself. The duplicate pre-check
// (idempotent.Seen) scopes its entries by that name together with the
// table and the consumer, so that two middlewares with one consumer name on
// different servers, databases or tables never answer for each other, and
// so that an event after which the database may lack claims the pre-check
// remembers starts the pre-check afresh (which costs only cache misses).
//
// The name must therefore change whenever the database could have lost
// committed claims: every restore, snapshot put back or physical copy
// started, which all end with a server start — so the name includes the
// server's start, as precisely as the server tells it — and a claim table
// re-created. It must differ between two servers that are not the same
// instance (a staging server cloned from production shares everything
// stored in the database with it, but not its start), and between tables
// that are not the same one. It must be the same on every connection that
// reaches the same table of the same running server, whatever the
// session's settings.
//
// Identity reads the name through q, on a connection of the middleware's
// pool, outside any transaction of a delivery: one or two cheap, read-only
// queries, on the middleware's first pre-check and again every few seconds
// (see idempotent.Middleware.SeenScope). Identity returns an error when it
// cannot tell (the table does not exist yet, the server hides what it
// needs, the database has no stable name such as an in-memory SQLite): the
// middleware then leaves the pre-check out rather than share a scope with
// anyone.
//
// A dialect without Identifier gets no pre-check: idempotent.New refuses
// WithSeen with it.
type Identifier interface {
	Identity(ctx context.Context, t Table, q QueryFunc) (string, error)
}
