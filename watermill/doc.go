// Package watermill is a Watermill (github.com/ThreeDotsLabs/watermill)
// message.HandlerMiddleware that applies each message's database effect
// exactly once with an [idempotent.Middleware], for every Watermill
// subscriber: AMQP, Kafka, NATS, SQL, GoChannel.
//
// The middleware begins a transaction on the Middleware's *sql.DB, claims the
// message — its key and the producer's event time — and, only if the claim
// is new, runs the handler with the transaction in the message's context
// ([TxFromContext]); claim and effect commit together before the handler
// returns, so before the router acks. A duplicate skips the handler and is
// acked. A handler error rolls back the claim with the effect and is
// returned (as a [*RequeueError]), so the router nacks the message and it
// comes back: a failed message is never marked seen.
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
// The producer sets the key and the event time:
//
//	msg.Metadata.Set(idwm.KeyMetadata, "order-completed:9912")
//	msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(completedAt))
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
// # Event times
//
// The retention fence and daily partitions rest on each message's event
// time, which must come from the producer and stay the same on every
// re-send, like the key. The middleware reads it by default from the
// metadata field adapter.EventTimeHeader ("Idempotent-Event-Time"), as
// adapter.FormatEventTime writes it, or with a function given with
// [WithEventTime] ([EventTimeMetadata] for another field, or one over the
// payload). A message without the field has no event time: on a plain
// table it is claimed by its key alone and the fence cannot apply; on a
// table partitioned by event day (idempotent.WithDailyPartitions) it is
// poison. A field that is not RFC 3339 is poison in either mode. No time a
// Pub/Sub stamps is read: one stamped on each publish is new on every
// re-send, and a re-send after UTC midnight would land in another day's
// partition and be applied again. The default counts as the producer's
// time source, so [New] accepts a partitioned Middleware with it or with
// WithEventTime, and refuses one with [WithoutEventTime] (an error
// matching adapter.ErrNoProducerEventTime) rather than failing every
// message later.
//
// Watermill's PoisonQueue republishes a message with its metadata, so a
// message replayed from the poison topic carries its event time back; the
// messages a handler produces through the outbox ([WithOutbox]) carry the
// field as the handler set it, or else the clock's time when the claim's
// transaction wrote them, stored once in the row, so every relay retry
// sends the same.
//
// # Settling
//
// Every answer goes through the one settle rule of package adapter
// (adapter.Rule.Settle; the table is in that package's documentation):
// Applied and Duplicate return nil, so the router acks; what a later
// delivery may fix — a handler error, a claim the transaction could not
// make, an event time less than adapter.DefaultFutureBound past the clock
// and its skew margin — returns a [*RequeueError]; what none can fix — no
// key, a bad event-time field, an event time older than the retention
// window or further ahead than the bound, a handler error marked with
// [Poison] — an error matching [ErrPoison], for a PoisonQueueWithFilter
// with [IsPoison].
//
// A Watermill Nack carries no delay. The router nacks a *RequeueError like
// any error, and GoChannel and watermill-amqp deliver the message again at
// once; the rule's delay is in RequeueError.Delay, and nothing waits for it
// unless something outside the middleware does. A future-dated message
// within the bound is therefore delivered again and again, without a
// transaction, until the clock reaches its event time; put
// middleware.Retry outside this middleware to space the deliveries out
// (its own intervals apply, not the rule's), or send requeues through a
// poison topic and Watermill's components/requeuer to a Pub/Sub that
// honours delay metadata. The middleware never sleeps with a message in
// hand.
//
// # Router order
//
// Watermill runs the middleware added first outermost, across
// router.AddMiddleware and handler.AddMiddleware calls in the order they
// were made. This middleware must sit inside every middleware that
// re-runs, swallows or delays the handler, directly around the handler:
//
//	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, ResetContextOnRetry: true}
//	h.AddMiddleware(poisonQueue, retry.Middleware, throttle.Middleware, middleware.Timeout(10*time.Second), exactlyOnce)
//
// Each, and why:
//
//   - middleware.PoisonQueue (and PoisonQueueWithFilter) outside: inside,
//     it would turn the handler's error into success, and the claim would
//     commit with whatever part of the effect the handler wrote before it
//     failed — the message marked seen, its effect never applied whole.
//   - middleware.Retry outside: each retry is then a new claim in a new
//     transaction, the failed attempt's partial effect rolled back with
//     it. Inside, Retry re-runs the handler within one claim's
//     transaction: the first attempt's partial writes stay, the retry adds
//     the whole effect again, and both commit — a doubled effect. The
//     middleware cannot see such a re-run. With Timeout inside Retry, set
//     Retry's ResetContextOnRetry: otherwise every attempt after the first
//     runs on the context the first attempt's Timeout cancelled, and fails.
//   - middleware.Throttle outside: it waits before the handler runs;
//     inside, it would wait with the claim's transaction open, holding a
//     connection and the claim's row lock.
//   - middleware.Timeout outside: its deadline is then the claim's too, and
//     a handler that overruns rolls back claim and effect together.
//     (Inside, the handler's statements fail at the deadline and roll back
//     just the same, but the claim's own statements and commit are not
//     bounded.)
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
