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
// does. Keys are scoped by consumer.
package seenredis
