// Package watermill is a Watermill (github.com/ThreeDotsLabs/watermill)
// router handler that applies each message's database effect exactly once
// with an [idempotent.Middleware], for every Watermill subscriber: AMQP,
// Kafka, NATS, SQL, GoChannel.
//
// [NewHandler] returns a message.NoPublishHandlerFunc. For each message it
// begins a transaction on the Middleware's *sql.DB, claims the message —
// its key and the producer's event time — and, only if the claim is new,
// runs your [Handler] in that transaction; claim and effect commit together
// before the handler returns, so before the router acks. A duplicate skips
// your Handler and is acked. An error rolls back the claim with the effect
// and is returned, so the router nacks the message and it comes back: a
// failed message is never marked seen.
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
//	credit, _ := idwm.NewHandler(mw, idwm.Decode(idwm.JSON[Order],
//		func(ctx context.Context, tx *sql.Tx, o Order, _ *message.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
//			return err
//		}))
//	poison, _ := middleware.PoisonQueueWithFilter(pub, "orders.poison", adapter.IsPoison)
//	router.AddMiddleware(poison)
//	router.AddConsumerHandler("loyalty", "orders", sub, credit)
//
// The producer gives the message its identity and its event time:
//
//	msg := message.NewMessage("order-completed:9912", payload)
//	msg.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(completedAt))
//
// # Keys
//
// The key is the message's UUID by default ([UUID]): the producer-set id of
// every Watermill message, which every Pub/Sub carries on each redelivery.
// It identifies the message's effect only where the producer keeps it
// across every publish of the same message — a UUID such as
// "order-completed:9912", or the row key a [Sender] publishes each outbox
// row under. A producer that calls watermill.NewUUID() at each publish (a
// retry after a failed publish, a forwarder that mints new messages) gives
// the same effect a new key: key by a field of the producer's instead,
// with [WithKey] and [Header] (a metadata field), [BodyField] (a field of a
// JSON payload) or [Prefixed]. A message without its key fails with
// adapter.ErrNoKey without opening a transaction; it is poison.
//
// # Event times
//
// The retention fence and daily partitions rest on each message's event
// time, which must come from the producer and stay the same on every
// re-send, like the key. The handler reads it by default from the metadata
// field adapter.EventTimeHeader ("Idempotent-Event-Time"), as
// adapter.FormatEventTime writes it, or with a function given with
// [WithEventTime] ([TimeHeader] for a field of the producer's own, or one
// over the payload). A message without the field has no event time: on a
// plain table it is claimed by its key alone and the fence cannot apply; on
// a table partitioned by event day (idempotent.WithDailyPartitions) it is
// poison. A field that is not RFC 3339 is poison in either mode. No time a
// Pub/Sub stamps is read, and there is no WithTransportEventTime: a
// Watermill message carries no transport time of its own, and one a
// Pub/Sub stamps in the metadata on each publish is new on every re-send —
// a re-send after UTC midnight would land in another day's partition and
// be applied again. NewHandler refuses [WithoutEventTime] for a
// partitioned Middleware (an error matching adapter.ErrNoProducerEventTime)
// rather than failing every message later.
//
// Watermill's PoisonQueue republishes a message with its metadata, so a
// message replayed from the poison topic carries its event time back; the
// messages a handler writes to an [Outbox] carry the field as the handler
// set it, or else the time the claim's transaction wrote them, stored once
// in the row, so every relay retry sends the same.
//
// # Settling
//
// Every answer goes through the one settle rule of package adapter
// (adapter.Rule.Settle; the table is in that package's documentation):
// Applied and Duplicate return nil, so the router acks; what a later
// delivery may fix — your Handler's error, a claim the transaction could not
// make, an event time less than the future bound ([WithFutureBound], by
// default the clock-skew margin) past the clock and its skew margin — returns
// a [*RequeueError], for the router to nack; what none can fix — no key, a
// bad event-time field, an event time older than the retention window or
// further ahead than the bound, a Handler error marked with adapter.Poison
// (or adapter.ErrUndecodable, as [Decode] marks a payload it cannot
// decode, or one a [WithPoison] predicate recognises), a Handler that
// ended the claim's transaction itself (idempotent.ErrAutocommit) — an
// error matching adapter.ErrPoison. Put
//
//	middleware.PoisonQueueWithFilter(pub, "orders.poison", adapter.IsPoison)
//
// on the router to take those: it publishes the message to the poison
// topic, once, and acks it. Without it the router nacks a poison message
// like any error, and it comes back forever.
//
// A Watermill nack carries no delay. GoChannel and watermill-amqp deliver
// a nacked message again at once; the rule's delay is in
// RequeueError.Delay (and Event.Delay), and nothing waits for it unless a
// router middleware does. A future-dated message within the bound is
// therefore delivered again and again, without a transaction, until the
// clock reaches its event time; put middleware.Retry on the router to
// space the deliveries out (its own intervals apply, not the rule's), or
// send requeues through a poison topic and Watermill's components/requeuer
// to a Pub/Sub that honours delay metadata. The handler never sleeps with
// a message in hand.
//
// # Observer and counts
//
// [WithObserver] gives an adapter.Observer the outcome of every call of the
// handler, before it returns, with Event.Detail the *message.Message and
// Event.Source the topic and UUID: exactly one of adapter.EventApplied,
// adapter.EventDuplicate (both: nil returned, the router acks),
// adapter.EventRequeued (a *RequeueError returned, the router nacks) and
// adapter.EventDeadLettered (a poison error returned, the router's
// PoisonQueue takes it). Watermill counts no deliveries, so Event.Attempt is
// 1, and a message middleware.Retry runs again is reported once per run.
// The router is the consumer loop, so there is no Consumer and no Stats
// method: for counts, give an *adapter.Counter as the Observer (its Next
// field chains yours) and read its Stats. Workers and shutdown are the
// router's too: there is no WithWorkers or WithShutdownTimeout.
//
// # Router order
//
// The handler is the innermost call of the router: every middleware, added
// with router.AddMiddleware or handler.AddMiddleware in any order, wraps
// the whole claim, effect and commit, and none can get between them. Any
// order is safe. What each does to a claim:
//
//   - middleware.Retry re-runs the handler after an error: each run is a
//     new claim in a new transaction, the failed run's partial effect rolled
//     back with it, so a run that failed half-way is never doubled by the
//     next. Poison is not worth retrying (it fails the same way, writing
//     nothing): set ShouldRetry to
//     func(p middleware.RetryParams) bool { return !adapter.IsPoison(p.Err) },
//     or put the PoisonQueue inside Retry. With Timeout inside Retry, set
//     Retry's ResetContextOnRetry: otherwise every run after the first gets
//     the context the first run's Timeout cancelled, and fails before it
//     claims.
//   - middleware.PoisonQueue (or PoisonQueueWithFilter) sees only what the
//     rule decided, after the rollback: a message it moves to the poison
//     topic left nothing written, not even its claim, so a replay from the
//     poison topic is applied. With the filter adapter.IsPoison it takes
//     poison alone and lets requeues through to the nack (or to Retry);
//     without a filter it takes requeues too, and the message goes to the
//     poison topic instead of coming back.
//   - middleware.Timeout bounds the handler's context, which is the
//     claim's: a handler that overruns fails, and claim and effect roll back
//     together; the message is requeued.
//   - middleware.Throttle waits before it calls the next handler: no
//     transaction is open while it waits, wherever it is.
//
// # watermill-sql
//
// With the watermill-sql (v4) subscriber, [WithSubscriberTx] makes the
// handler claim in the subscriber's own transaction, so that the claim, the
// effect and the subscriber's offset commit together (its doc shows the
// lines that get the *sql.Tx out of watermill-sql's context). The
// subscriber commits; each call runs under a savepoint that a failure rolls
// back, because watermill-sql resends a nacked message in the same
// transaction rather than rolling it back.
//
// # Messages the handler produces
//
// The router publishes the messages a handler returns after the handler —
// after the commit — and before the ack; if that publish failed, the
// redelivery would be a duplicate, the handler would not run, and the
// messages would never go out. So the handler returns none: your Handler
// writes them with an [Outbox] into the outbox package's table in the
// claim's transaction, and an outbox.Relay publishes them with a [Sender]
// wrapping any Watermill publisher, each under a UUID that every retry
// repeats, so a consumer downstream with this package applies it once.
//
// Watermill's forwarder component (components/forwarder) is the other way
// to the same end: the Handler publishes, through a watermill-sql publisher
// built on the claim's transaction and wrapped by forwarder.NewPublisher,
// into an SQL table in the same transaction, and the forwarder moves the
// messages to the real broker with their UUID and metadata.
package watermill
