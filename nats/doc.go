// Package nats consumes a NATS JetStream stream (through
// github.com/nats-io/nats.go/jetstream) and applies each message's database
// effect exactly once with an [idempotent.Middleware], acknowledging late: a
// message is acked, with DoubleAck, only after its transaction has
// committed, for [idempotent.Applied] and [idempotent.Duplicate] alike.
//
// JetStream's Nats-Msg-Id deduplicates publishes within the stream's
// duplicate window; it does nothing for redeliveries. A message whose ack was
// lost, whose handler outlived AckWait, or whose consumer process died after
// its commit is delivered again — and DoubleAck cannot tell which delivery it
// acked. The claim makes every such delivery a Duplicate.
//
// # Quickstart
//
//	nc, _ := nats.Connect(nats.DefaultURL)
//	js, _ := jetstream.New(nc)
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable:   "loyalty",
//		AckPolicy: jetstream.AckExplicitPolicy,
//	})
//	mw, _ := idnats.NewMiddleware(db, postgres.New(), cons) // consumer name "loyalty"
//	_ = mw.EnsureSchema(ctx)
//	h, _ := idnats.Decode(mw, idnats.MsgID(), idnats.JSON[OrderCompleted], credit)
//	c, _ := idnats.NewConsumer(h)
//	err := c.Run(ctx, cons) // nil after a graceful shutdown
//
// Producers set the key with jetstream.WithMsgID("order-completed:9912"),
// and the event time in the Idempotent-Event-Time header
// ([adapter.EventTimeHeader], written by [adapter.FormatEventTime]).
//
// # Settling
//
// A [Consumer] pulls from a durable pull consumer with AckExplicit (Run
// refuses any other with [ErrNotDurable]) with a fixed number of workers, and
// settles every message as [adapter.Rule.Settle] decides — the one settle
// rule every adapter of this module shares — in one of three ways:
//
//   - Ack, the handler succeeded (Applied or Duplicate): DoubleAck, which
//     waits for the server to confirm the ack;
//   - Poison: Term, so the server never redelivers it, and the settlement
//     is reported to [WithOnSettle] with Action [Terminated] and the error
//     (the server also publishes a
//     $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED advisory). That is a
//     message with no key ([ErrNoKey]) or an invalid one
//     ([idempotent.ErrInvalidKey]), an event time older than the retention
//     window ([idempotent.ErrBeyondRetention]), an Idempotent-Event-Time
//     header that is not an RFC 3339 time ([adapter.ErrBadEventTime]), no
//     event time on a partitioned claim table, or one dated more than
//     [adapter.DefaultFutureBound] past the clock plus the clock-skew
//     margin ([idempotent.ErrInvalidEventTime]); and, of the errors the
//     rule would requeue, undecodable data ([ErrUndecodable]), an error the
//     handler marked with [Poison], or one a predicate of [WithPoison]
//     recognises;
//   - Requeue: NakWithDelay — any other failure (the transaction's
//     retryable failures, a missing partition, the handler's own errors),
//     after idempotent.RetryPolicy.Backoff of the server's delivery count,
//     from one second up to one minute ([WithNakDelay]); and a message
//     dated in the future within the bound, after at least the time until
//     the Middleware's clock catches up, when it is applied. The consumer's
//     MaxDeliver bounds the number of deliveries.
//
// Errors are recognised with errors.Is on the library's public error values
// only ([IsPoison]), never by message text.
//
// # Event times
//
// The retention fence and daily partitions ([idempotent.WithDailyPartitions])
// rest on each message's event time, and it must come from the producer,
// the same on every re-send, like the key. By default [Process], [Decode],
// [ProcessBatch] and [DecodeBatch] read it from the Idempotent-Event-Time
// header ([adapter.EventTimeHeader], RFC 3339). A message without the header
// has no event time: on a plain claim table it is claimed by its key alone,
// with no retention fence; on a partitioned one it is poison. The header
// default counts as the producer's event time, and so do [WithEventTime]
// (a field of the data, or another header with [TimeHeader]) and
// [WithTransportEventTime] (the stream's timestamp: new on every re-send, so
// a re-send after UTC midnight is applied again — only where every message
// is published once). [WithoutEventTime] reads none; for a Middleware in
// partitioned mode the constructors refuse it with an error matching
// [adapter.ErrNoProducerEventTime], rather than terminating every message
// later.
//
// While a handler runs longer than half the consumer's AckWait, the worker
// sends InProgress every half AckWait, so the server does not hand the
// message to another worker meanwhile.
//
// # Keys
//
// The message key must be an identity the producer assigned: the
// Nats-Msg-Id header ([MsgID], the default), another header ([Header]) or a
// field of the data ([BodyField]) — never the stream sequence, which a
// republish changes, nor the delivery count. The idempotent consumer name is
// the durable's name ([NewMiddleware]) unless you give idempotent.New
// another.
//
// # Batches
//
// [NewBatchConsumer] fetches up to n messages per pull request and hands
// them to a [BatchHandler] ([ProcessBatch], [DecodeBatch]), which claims and
// applies them, with their event times, in one transaction with idempotent's
// Middleware.ProcessMessages — an order of magnitude more messages per
// second when the effect is cheap. A message with no key, undecodable data,
// or an event time the Middleware refuses is set aside and settled on its
// own, as the rule says;
// when the batch's transaction fails, each message is retried on its own so
// that one poison message is terminated without holding back the rest.
//
// # Shutdown and failures
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// no new pull requests, in-flight messages finished and acked, messages that
// arrived meanwhile naked for immediate redelivery). While the cluster elects
// a leader or the connection reconnects, failed pull requests are retried
// with backoff. Run returns an error matching [ErrConnectionClosed] when the
// connection was closed, and [ErrConsumerGone] when the consumer or its
// stream was deleted. Messages whose ack did not reach the server come back
// after AckWait, and the claim makes them duplicates.
//
// # Outbox
//
// A [Sender] publishes the rows of the outbox package to JetStream with
// Nats-Msg-Id set to each row's idempotency key: a relay that publishes
// again after a lost PubAck is dropped by the stream (PubAck.Duplicate), and
// a consumer reading the key with [MsgID] applies it once even after the
// duplicate window. Each call's event time, in the Idempotent-Event-Time
// header, is the row's CreatedAt: the same on every publish of the row.
package nats
