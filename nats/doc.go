// Package nats consumes a NATS JetStream stream (through
// github.com/nats-io/nats.go/jetstream) and applies each message's database
// effect exactly once with an [idempotent.Middleware], acknowledging late: a
// message is acked, with DoubleAck, only after its transaction has
// committed, for a new claim and a duplicate alike.
//
// JetStream's Nats-Msg-Id deduplicates publishes within the stream's
// duplicate window; it does nothing for redeliveries. A message whose ack
// was lost, whose handler outlived AckWait, or whose consumer process died
// after its commit is delivered again — and DoubleAck cannot tell which
// delivery it acked. The claim makes every such delivery a Duplicate.
//
// The package has the shape every broker adapter of this module has
// (docs/adapters.md): a [Handler] or [BatchHandler] that runs only for a
// new claim, in the claim's transaction; [NewConsumer] and
// [NewBatchConsumer]; the key functions; the options of package adapter's
// Config; an [adapter.Observer] told of every settlement; and
// [adapter.Rule.Settle], the one settle rule.
//
// # Quickstart
//
//	nc, _ := nats.Connect(nats.DefaultURL)
//	js, _ := jetstream.New(nc)
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable:   "loyalty",
//		AckPolicy: jetstream.AckExplicitPolicy,
//	})
//	mw, _ := idempotent.New(db, postgres.New(), "loyalty")
//	_ = mw.EnsureSchema(ctx)
//	c, _ := idnats.NewConsumer(mw, idnats.Decode(idnats.JSON[OrderCompleted], credit))
//	err := c.Run(ctx, cons) // nil after a graceful shutdown
//
// Producers set the key with jetstream.WithMsgID("order-completed:9912"),
// and the event time in the Idempotent-Event-Time header
// ([adapter.EventTimeHeader], written by [adapter.FormatEventTime]). The
// Middleware's consumer name keeps the claims of one JetStream durable
// apart from another's: name it after the durable, and keep the name when
// the durable is renamed.
//
// # Settling
//
// A [Consumer] pulls from a durable pull consumer with AckExplicit (Run
// refuses any other with [ErrNotDurable]) with a fixed number of workers
// ([WithWorkers]), and settles every message as [adapter.Rule.Settle]
// decides, in one of three ways:
//
//   - Ack, the claim was new and the effect committed, or the claim
//     existed: DoubleAck, which waits for the server to confirm the ack
//     ([adapter.EventApplied], [adapter.EventDuplicate]). A per-message
//     worker does not wait with it: it takes its next message while the
//     confirmation of the last arrives, and waits for that confirmation
//     before it settles the next one (and before Run returns);
//   - DeadLetter: with WithDeadLetter, first an outbox dead letter written
//     in a transaction (see package deadletter); then Term, so the server
//     never redelivers it (it publishes a
//     $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED advisory)
//     ([adapter.EventDeadLettered], with the error). That is a message with
//     no key ([adapter.ErrNoKey]) or an invalid one
//     ([idempotent.ErrInvalidKey]), an event time older than the retention
//     window ([idempotent.ErrBeyondRetention]), an Idempotent-Event-Time
//     header that is not an RFC 3339 time ([adapter.ErrBadEventTime]), no
//     event time on a partitioned claim table ([adapter.ErrNoEventTime]),
//     one dated more than the future bound ([WithFutureBound]) past the
//     clock plus the clock-skew margin ([idempotent.ErrInvalidEventTime]),
//     a handler that left the claim's transaction
//     ([idempotent.ErrAutocommit]), undecodable data
//     ([adapter.ErrUndecodable]), an error the handler marked with
//     [adapter.Poison], or one the predicate of [WithPoison] recognises;
//   - Requeue: NakWithDelay — any other failure (the transaction's
//     retryable failures past the Middleware's retry policy, a missing
//     partition, the handler's own errors) after
//     idempotent.RetryPolicy.Backoff of the server's delivery count
//     (NumDelivered, which is also [adapter.Event].Attempt)
//     ([WithRetryDelay]); and a message dated in the future within the
//     bound, after at least the time until the Middleware's clock catches
//     up ([adapter.EventRequeued], with the delay). The consumer's
//     MaxDeliver bounds the number of deliveries.
//
// Errors are recognised with errors.Is on the library's public error
// values only, never by message text. An ack, nak or term that cannot be
// sent is reported as [adapter.EventSettleFailed] too, after the
// settlement's own event: the server delivers the message again after
// AckWait, and the claim makes it a duplicate if its effect committed.
//
// While a handler runs longer than half the consumer's AckWait, the worker
// sends InProgress every half AckWait, so the server does not hand the
// message to another worker meanwhile.
//
// # Observing
//
// [WithObserver] sets an [adapter.Observer] told, on the worker's
// goroutine, of exactly one of EventApplied, EventDuplicate,
// EventRequeued, EventDeadLettered and EventReleased per delivery, after
// the server was told; its Message is the key and event time as read,
// Source "<stream>/<durable>/<stream sequence>", and Detail the
// jetstream.Msg itself. It is told of EventSettleFailed, and of
// EventFetchError for every failed pull request that Run retries (Source
// "<stream>/<durable>"). [Consumer.Stats] counts the same events.
//
// # Event times
//
// The retention fence and daily partitions ([idempotent.WithDailyPartitions])
// rest on each message's event time, and it must come from the producer,
// the same on every re-send, like the key. By default a Consumer reads it
// from the Idempotent-Event-Time header ([adapter.EventTimeHeader], RFC
// 3339). A message without the header has no event time: on a plain claim
// table it is claimed by its key alone, with no retention fence; on a
// partitioned one it is poison. [WithEventTime] reads it with a function
// of your own (a field of the data, or another header with [TimeHeader]),
// which counts as the producer's time too. [WithTransportEventTime] reads
// the stream's timestamp instead: new on every re-send, so a re-send after
// UTC midnight would be applied again — only where every message is
// published once. [WithoutEventTime] reads none. For a Middleware in
// partitioned mode the constructors refuse the last two with an error
// matching [adapter.ErrNoProducerEventTime], rather than terminating every
// message later.
//
// # Keys
//
// The message key must be an identity the producer assigned: the
// Nats-Msg-Id header ([MsgID], the default), another header ([Header]) or
// a field of the data ([BodyField]), maybe [Prefixed] — never the stream
// sequence, which a republish changes, nor the delivery count. Set it with
// [WithKey].
//
// # Batches
//
// [NewBatchConsumer] fetches up to the batch size of messages per pull
// request ([WithBatchSize]) and claims them, with their event times, in
// one transaction with idempotent's Middleware.ProcessMessages, handing
// the [BatchHandler] the fresh ones — an order of magnitude more messages
// per second when the effect is cheap. Each message is then settled on its
// own by the rule. A message whose key or event time cannot be read, or
// that the Middleware would refuse (idempotent.Middleware.CheckMessage:
// too old, dated in the future), is set aside before the transaction. A
// handler that returns [adapter.PoisonItem](i, err) has message i
// terminated alone, and the rest of the batch runs again without it; any
// other error of the batch settles every message of it by the rule.
//
// # Shutdown and failures
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// no new pull requests, in-flight messages finished and acked, messages
// that arrived meanwhile naked for immediate redelivery, reported as
// EventReleased). While the cluster elects a leader or the connection
// reconnects, failed pull requests are retried with backoff. Run returns
// an error matching [ErrConnectionClosed] when the connection was closed,
// and [ErrConsumerGone] when the consumer or its stream was deleted.
// Messages whose ack did not reach the server come back after AckWait, and
// the claim makes them duplicates.
//
// # Outbox
//
// A [Sender] publishes the rows of the outbox package to JetStream with
// Nats-Msg-Id set to each row's idempotency key: a relay that publishes
// again after a lost PubAck is dropped by the stream (PubAck.Duplicate),
// and a consumer reading the key with [MsgID] applies it once even after
// the duplicate window. Each call carries its event time in the
// Idempotent-Event-Time header — the one it was enqueued with
// (outbox.WithEventTime), else the row's CreatedAt —, the same on every
// publish of the row.
package nats
