// Package cdkpubsub applies messages from any gocloud.dev/pubsub
// Subscription — Google Cloud Pub/Sub, Amazon SQS and SNS, Azure Service
// Bus, NATS, Kafka, RabbitMQ, mempubsub — exactly once in effect, through
// an idempotent.Middleware: each message's key is claimed in the same
// database transaction as its effect, and the message is acknowledged only
// after that transaction has committed.
//
// It has the shape of every adapter of this module (see docs/adapters.md):
//
//	c, err := cdkpubsub.NewConsumer(mw, cdkpubsub.Decode(cdkpubsub.JSON[OrderCompleted],
//		func(ctx context.Context, tx *sql.Tx, o OrderCompleted, msg *pubsub.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
//			return err
//		}))
//	sub, err := pubsub.OpenSubscription(ctx, "gcppubsub://projects/shop/subscriptions/loyalty")
//	err = c.Run(ctx, sub) // then sub.Shutdown, which sends the last acks
//
// NewBatchConsumer claims up to WithBatchSize received messages in one
// transaction (mw.ProcessMessages) and hands the fresh ones to a
// BatchHandler; each message is still settled on its own.
//
// # Keys and event times
//
// gocloud.dev/pubsub has no producer-set message id common to its drivers:
// LoggableID is assigned by the service on most of them, and a re-send gets
// a new one. So the key is read by default from the metadata key
// [DefaultKeyMetadata] ("idempotency-key"), which the producer sets — and
// which [NewSender] sets from the outbox idempotency key. [Metadata] (or
// [Header]) reads another key, [BodyField] a field of a JSON body, and
// [Prefixed] keeps the keys of message types apart.
//
// The event time, on which the retention fence and daily partitions rest,
// is read from the metadata key adapter.EventTimeHeader, or with
// WithEventTime from the body or a metadata key of the producer's own
// ([TimeMetadata]). There is no WithTransportEventTime: no time is common
// to the drivers, and a publish time is new on every re-send anyway.
// WithoutEventTime claims by key alone, and is refused on a partitioned
// claim table (adapter.ErrNoProducerEventTime).
//
// # Settling
//
// adapter.Rule.Settle decides, once the Middleware has answered:
//
//   - Applied or Duplicate: Message.Ack, after the commit.
//   - Requeue (a handler error, a claim held by another transaction, a
//     message dated a little in the future: no further ahead than the
//     clock-skew margin by default, WithFutureBound): the worker holds the
//     message for the rule's delay (WithRetryDelay, at most
//     MaxRetryDelay, cut short by a shutdown), then calls Message.Nack
//     where the driver can (Message.Nackable), so it comes again at once.
//     Where it cannot, the message is left unacknowledged and comes again
//     when its ack deadline passes. gocloud.dev/pubsub counts no
//     deliveries, so the delay does not grow from one delivery to the
//     next; bound redeliveries with the service's own dead-letter policy
//     (a Pub/Sub dead-letter topic, an SQS redrive policy, Service Bus's
//     maximum delivery count).
//   - DeadLetter (poison: an undecodable body, no key, a bad event time,
//     adapter.Poison, older than the retention window, dated ahead beyond
//     the future bound): with
//     WithDeadLetter, one outbox row is written and committed, then the
//     message is acked; an outbox Relay with DeadLetterSender publishes it
//     to a dead-letter Topic with its original metadata and event time.
//     Without it the message is acked and dropped. Either way the
//     Observer hears adapter.EventDeadLettered.
//
// The Observer (WithObserver) hears exactly one of adapter.EventApplied,
// EventDuplicate, EventRequeued, EventReleased and EventDeadLettered per
// delivery, with Detail the *pubsub.Message; Stats counts them.
//
// Ack and Nack return at once: gocloud.dev/pubsub sends them in the
// background, in batches. A crash before one is sent only means the
// message comes again, and its claim makes it a Duplicate. Call
// Subscription.Shutdown after Run returns to send the last ones.
//
// # Handlers that run past the ack deadline
//
// Every at-least-once service gives a received message a deadline, after
// which it delivers the message again, to this consumer or another. While
// a handler runs, its transaction holds the message's claim, so the second
// delivery's claim waits on it (up to the Middleware's lock timeout, and
// is requeued if that runs out) and, once the first commits, finds it: the
// second delivery is a Duplicate, and the effect is applied once. The
// claim makes an expired deadline safe, not free — each expiry costs a
// delivery, a wait and a connection — so size the deadline well above the
// handler's time, the retry delay and, for a batch consumer, the batch's:
//
//   - Amazon SQS (awssnssqs): the queue's visibility timeout (30s unless
//     set on the queue), not extended by the driver. The late first
//     consumer's delete may fail or be ignored; the copy comes again and is
//     a Duplicate.
//   - Google Cloud Pub/Sub: gcppubsub (raw Pull) keeps the subscription's
//     ack deadline (10s to 600s, 10s by default), not extended;
//     gcppubsubv2 uses the Go client's streaming pull, which extends
//     deadlines while a message is outstanding (up to its MaxExtension).
//     A subscription with exactly-once delivery refuses a late ack.
//   - Azure Service Bus (azuresb, peek-lock): the entity's lock duration
//     (one minute unless set, at most five), not renewed by the driver;
//     completing a message whose lock expired fails, and Service Bus
//     counts the delivery toward its maximum delivery count, past which it
//     moves the message to its own dead-letter queue.
//   - mempubsub: the ack deadline given to mempubsub.NewSubscription.
//
// # Senders
//
// [NewSender] is an outbox.Sender publishing each call's payload to a
// Topic with the idempotency key in DefaultKeyMetadata and the event time
// in adapter.EventTimeHeader; [DeadLetterSender] publishes the dead letters
// of WithDeadLetter. Most services keep no memory of what was sent, so a
// relay's repeated publish is dropped by the consumer's claim. An SQS FIFO
// queue drops a repeated MessageDeduplicationId (set through WithMetadata:
// awssnssqs reads the "DeduplicationId" metadata key) — but only within
// five minutes of the first send, so it saves some duplicates and never
// replaces the claim: a relay retry after a longer backoff, or after a
// lease expired, comes later than that.
//
// # Shutdown
//
// When Run's context ends it receives no more, lets the handlers in flight
// finish (for up to WithShutdownTimeout) and acks them, hands back a
// message held for its retry delay or received as the context ended
// (EventReleased), and returns nil.
package cdkpubsub
