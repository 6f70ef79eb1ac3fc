// Package watermill is a Watermill (github.com/ThreeDotsLabs/watermill)
// message.HandlerMiddleware that applies each message's database effect
// exactly once with an [idempotent.Middleware], for every Watermill
// subscriber: AMQP, Kafka, NATS, SQL, GoChannel.
//
// The middleware begins a transaction on the Middleware's *sql.DB, claims the
// message key, and — only if the claim is new — runs the handler with the
// transaction in the message's context ([TxFromContext]); claim and effect
// commit together before the handler returns, so before the router acks. A
// duplicate skips the handler and is acked. A handler error rolls back the
// claim with the effect and is returned, so the router nacks the message and
// it comes back: a failed message is never marked seen.
//
// Watermill's own middleware.Deduplicator is an in-memory map with a time
// window: it marks a message seen before the handler runs and never unmarks
// it, so a message whose handler failed is dropped as a duplicate when it
// comes back within the window (the effect is lost), and it does not work
// across processes. The claim is durable, shared by every process, and
// rolls back with a failure.
//
// # Quickstart
//
//	mw, _ := idempotent.New(db, postgres.New(), "loyalty")
//	_ = mw.EnsureSchema(ctx)
//	exactlyOnce, _ := idwm.New(mw)
//	router.AddNoPublisherHandler("loyalty", "orders", sub, func(msg *message.Message) error {
//		tx := idwm.TxFromContext(msg.Context())
//		_, err := tx.ExecContext(msg.Context(), "UPDATE balances SET points = points + $1 WHERE customer_id = $2", …)
//		return err
//	}).AddMiddleware(exactlyOnce)
//
// The producer sets the key: msg.Metadata.Set(idwm.KeyMetadata, "order-completed:9912").
//
// # Keys
//
// The key comes from the metadata field [KeyMetadata] ("idempotency_key") by
// default, or from a [KeyFunc] given with [WithKey]: [Metadata] for another
// field, [UUID] for the message's UUID — only where the producer keeps the
// UUID stable across every publish of the same message (watermill.NewUUID()
// at each publish, or a forwarder that mints new messages, makes every
// publish a new key). A message without a key fails with [ErrNoKey] without
// opening a transaction; it is poison ([IsPoison]): put Watermill's
// middleware.PoisonQueueWithFilter(pub, topic, idwm.IsPoison) before this
// middleware to move such messages aside instead of nacking them forever.
//
// # Messages the handler produces
//
// The router publishes the messages a handler returns after the handler —
// after the commit — and before the ack; if that publish fails, the
// redelivery is a duplicate, the handler does not run, and the messages
// never go out. So the middleware does not hand them to the router:
//
//   - with [WithOutbox], they are written to the outbox package's table in
//     the claim's transaction, and an outbox.Relay publishes them with a
//     [Sender] wrapping any Watermill publisher, each with its UUID and
//     KeyMetadata set to the row's idempotency key — the same on every
//     retry, so a consumer downstream with this middleware applies it once;
//   - without an outbox, a handler that returns messages fails with
//     [ErrProducedMessages] and its transaction rolls back.
//
// Watermill's forwarder component (components/forwarder) is the other way
// to the same end: the handler publishes, through a watermill-sql publisher
// built on TxFromContext's transaction and wrapped by forwarder.NewPublisher,
// into an SQL table in the same transaction, and the forwarder moves the
// messages to the real broker. The forwarder republishes with the original
// UUID and metadata, so keep the key in KeyMetadata (or use [UUID] when the
// handler sets a stable UUID).
//
// # watermill-sql
//
// With the watermill-sql (v4) subscriber, [WithSubscriberTx] makes the
// middleware claim in the subscriber's own transaction, so that the claim,
// the effect and the subscriber's offset commit together (its doc shows the
// lines that get the *sql.Tx out of watermill-sql's context). The
// subscriber commits; each attempt runs under a savepoint that a failure
// rolls back, because watermill-sql resends a nacked message in the same
// transaction rather than rolling it back.
package watermill
