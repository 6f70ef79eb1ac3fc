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
//	c, _ := idnats.NewConsumer(idnats.Decode(mw, idnats.MsgID(), idnats.JSON[OrderCompleted], credit))
//	err := c.Run(ctx, cons) // nil after a graceful shutdown
//
// Producers set the key with jetstream.WithMsgID("order-completed:9912").
//
// # Settling
//
// A [Consumer] pulls from a durable pull consumer with AckExplicit (Run
// refuses any other with [ErrNotDurable]) with a fixed number of workers, and
// settles every message one of three ways:
//
//   - the handler succeeded: DoubleAck, which waits for the server to
//     confirm the ack;
//   - the message is poison — it has no key ([ErrNoKey]), its key is
//     invalid ([idempotent.ErrInvalidKey]), its data cannot be decoded
//     ([ErrUndecodable]), its event time is missing
//     ([idempotent.ErrInvalidEventTime]) or older than the retention window
//     ([idempotent.ErrBeyondRetention], see [WithEventTime]), or the
//     handler marked the error with [Poison]: Term, so the server never
//     redelivers it, and the settlement is reported to [WithOnSettle] with
//     Action [Terminated] and the error (the server also publishes a
//     $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED advisory). More poison
//     errors can be added with [WithPoison];
//   - any other failure: NakWithDelay, the delay doubling with the server's
//     delivery count from one second up to one minute ([WithNakDelay]); the
//     consumer's MaxDeliver bounds the number of deliveries.
//
// Poison is recognised with errors.Is on the library's public error values
// only ([IsPoison]), never by message text.
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
// applies them in one transaction with idempotent's Middleware.ProcessBatch
// — an order of magnitude more messages per second when the effect is
// cheap. A message with no key or undecodable data is set aside as poison;
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
// duplicate window.
package nats
