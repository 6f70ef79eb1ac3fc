// Package rabbitmq consumes a RabbitMQ queue (through
// github.com/rabbitmq/amqp091-go) and applies each delivery's database effect
// exactly once with an [idempotent.Middleware], acknowledging late: a
// delivery is acked only after its transaction has committed, for
// [idempotent.Applied] and [idempotent.Duplicate] alike.
//
// A [Consumer] reads one queue with manual acks, a prefetch limit and a fixed
// number of workers, and settles every delivery one of three ways:
//
//   - the handler succeeded: ack;
//   - the message is poison — it has no key ([ErrNoKey]), its key is invalid
//     ([idempotent.ErrInvalidKey]), its body cannot be decoded
//     ([ErrUndecodable]), it is older than the retention window
//     ([idempotent.ErrBeyondRetention]) or its event time is zero or in the
//     future ([idempotent.ErrInvalidEventTime]), or the handler marked the
//     error with [Poison]:
//     reject without requeue, so the broker moves it to the queue's
//     dead-letter exchange (or drops it, if the queue has none). More poison
//     errors can be added with [WithPoison];
//   - any other failure: wait the requeue delay ([WithRequeueDelay], one
//     second by default), then nack with requeue, so a failing message
//     comes back without spinning. This includes what is not possible yet
//     but will be: a day whose partition MaintainPartitions has not created
//     yet ([idempotent.ErrNoPartition]), a claim held by another delivery
//     ([idempotent.ErrClaimBusy]) and exhausted retries
//     ([idempotent.ErrRetriesExhausted]).
//
// The message key must be an identity the producer assigned — the AMQP
// message_id property ([MessageID]), a header ([Header]) or a field of the
// body ([BodyField]) — never the delivery tag, which the broker assigns per
// delivery, nor any id a broker or relay reassigns when it republishes or
// replays a dead-lettered message.
//
// In partitioned mode (idempotent.WithDailyPartitions), and wherever the
// retention fence should apply, each delivery also needs its event time:
// give [Process] or [Decode] the option [WithEventTime], usually with
// [Timestamp] (the AMQP timestamp property the producer set in
// amqp091.Publishing.Timestamp), and deliveries go through
// idempotent.Middleware.ProcessMessage. A delivery whose event time cannot be
// read ([ErrNoEventTime]) or is refused by the fence is poison; a day whose
// partition does not exist yet is requeued. Like the key, the event time
// must be the producer's and stable across republishes: a redelivery on a
// later day then lands in the same partition and meets its claim. Process
// and Decode panic when given a partitioned Middleware without
// WithEventTime.
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// in-flight deliveries finished and were acked, prefetched ones handed back),
// and an error matching [ErrChannelClosed] when the channel or its connection
// closed under it. Reconnecting is the caller's loop: open a new channel and
// call Run again. Deliveries whose ack was lost come back, and the claim makes
// them duplicates.
//
// [WithDeliveryContext] derives each delivery's context from the delivery
// before the handler runs: with OpenTelemetry, extract the producer's trace
// context from the headers there (otelmetrics.ContextFromHeaders), and the
// middleware's span for the delivery continues that trace. The package
// itself imports no tracing library.
package rabbitmq
