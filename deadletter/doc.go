// Package deadletter lets an operator, or a tool of their own, see and
// operate the dead letters the library's adapters write through the outbox:
// kafka, redisstream, nats, rabbitmq and cdkpubsub with their WithDeadLetter option turn
// each poison message into an outbox row of a dead-letter kind, holding the
// message (key, headers, value), why it was poison, and its event time.
//
// A [Store] over an outbox table:
//
//   - [Store.List] pages through the dead letters a [Filter] selects (by
//     consumer, source topic or stream, message key, a text of the reason,
//     a time range, ids);
//   - [Store.Show] returns one, decoded, with what was done to it
//     ([Store.History]);
//   - [Store.Replay] sends the selected ones back to their source, each as
//     an outbox row of kind [ReplayKind] that a Relay with the transport's
//     replay sender (kafka.ReplaySender, redisstream.ReplaySender,
//     nats.ReplaySender, rabbitmq.ReplaySender) produces
//     with the original key, headers and event time: a message applied since
//     answers Duplicate, one never applied is applied once;
//   - [Store.Discard] deletes them.
//
// Replays and discards are recorded, with who did them and when, in an
// audit table ([Store.EnsureSchema] creates it), in the same transaction as
// the change. A filter that selects everything, an unknown id or a missing
// actor is refused before anything changes.
//
//	store, err := deadletter.New(db, deadletter.WithTable("app.outbox"))
//	…
//	dls, next, err := store.List(ctx, deadletter.Filter{Topic: "payments", Reason: "ledger refused"})
//	…
//	actions, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{dls[0].ID}}, "alice")
//
// The "idempotent dead-letters" command of cmd/idempotent is built on it.
//
// The outbox, and so every dead letter, is Postgres only; so is the Store.
// Without WithDeadLetter, RabbitMQ rejects a poison message to its queue's
// DLX and NATS terminates it: neither is then in the outbox, and
// docs/rabbitmq.md says when to choose the DLX.
package deadletter
