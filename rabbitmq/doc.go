// Package rabbitmq consumes a RabbitMQ queue (through
// github.com/rabbitmq/amqp091-go) and applies each delivery's database effect
// exactly once with an [idempotent.Middleware], acknowledging late: a
// delivery is acked only after its transaction has committed, for
// [idempotent.Applied] and [idempotent.Duplicate] alike.
//
// [NewConsumer] takes the Middleware and a [Handler], which runs only for a
// delivery whose claim is new, inside the claim's transaction:
//
//	c, err := rabbitmq.NewConsumer(mw, rabbitmq.Decode(rabbitmq.JSON[orderCompleted], credit))
//	...
//	err = c.Run(ctx, ch, "loyalty.order-completed") // nil after a graceful shutdown
//
// [Consumer.Run] reads the queue with manual acks, a prefetch limit and a
// fixed number of workers, and settles every delivery through the one
// settle rule of every adapter, [adapter.Rule.Settle]:
//
//   - applied, or found applied before: ack;
//   - poison — an error marked with [adapter.Poison] (or
//     [adapter.ErrUndecodable]), one a [WithPoison] predicate recognises, or
//     one the rule calls poison: no key ([adapter.ErrNoKey]) or an invalid
//     key ([idempotent.ErrInvalidKey]), older than the retention window
//     ([idempotent.ErrBeyondRetention]), no event time where one is needed
//     ([adapter.ErrNoEventTime]), a bad event-time header
//     ([adapter.ErrBadEventTime]), or dated beyond the future bound
//     ([WithFutureBound], [adapter.DefaultFutureBound]) ahead of the clock:
//     reject without requeue, so the broker moves it to the queue's
//     dead-letter exchange (or drops it, if the queue has none) — or, with
//     WithDeadLetter, writes it as an outbox dead letter that package
//     deadletter lists and replays, then acks it;
//   - dated ahead of the Middleware's clock within the bound: hold it up to
//     the retry delay's maximum, then nack with requeue, until the clock has
//     caught up;
//   - any other failure: hold it the retry delay ([WithRetryDelay]), then
//     nack with requeue, so a failing message comes back without spinning.
//     This includes what is not possible yet: a day whose partition
//     MaintainPartitions has not created yet ([idempotent.ErrNoPartition]),
//     a claim held by another delivery ([idempotent.ErrClaimBusy]) and
//     exhausted retries ([idempotent.ErrRetriesExhausted]). The attempt the
//     delay grows with is a quorum queue's x-delivery-count header plus
//     one, else 1.
//
// [NewBatchConsumer] claims what the broker has sent ahead, up to
// [WithBatchSize] deliveries, in one transaction with
// idempotent.Middleware.ProcessMessages and runs a [BatchHandler] once for
// the fresh ones; each delivery is still settled on its own.
//
// The message key must be an identity the producer assigned — the AMQP
// message_id property ([MessageID], the default), a header ([Header]) or a
// field of the body ([BodyField]), given with [WithKey] — never the
// delivery tag, which the broker assigns per delivery, nor any id a broker
// or relay reassigns when it republishes or replays a dead-lettered
// message.
//
// Event times come from the producer: by default each delivery's event
// time is read from the [adapter.EventTimeHeader] header
// ("Idempotent-Event-Time", RFC 3339, as adapter.FormatEventTime writes it)
// and goes with its key to the Middleware, so the retention fence applies
// and, in partitioned mode (idempotent.WithDailyPartitions), the claim
// lands in the event day's partition. Like the key, the producer sets it
// once and every re-send keeps it: a re-send on a later day meets its
// claim. [WithEventTime] reads it with a function of yours instead
// ([TimeHeader] for a header of your own). [WithTransportEventTime] reads
// the AMQP timestamp property, which a re-send stamps anew, and
// [WithoutEventTime] none; both are refused for a partitioned Middleware
// with an error matching [adapter.ErrNoProducerEventTime]. On a plain table
// a delivery without the header has no event time and no fence; in
// partitioned mode it is poison. The broker's dead-lettering keeps the
// header, so a replay from the dead-letter queue carries it forward.
//
// [WithObserver] hears one [adapter.Event] per settled delivery (applied,
// duplicate, requeued, dead-lettered, or released at shutdown), with the
// *amqp091.Delivery in Event.Detail, and an [adapter.EventSettleFailed] in
// addition when the ack, nack or reject could not be sent; [Consumer.Stats]
// counts them.
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// in-flight deliveries finished and were settled, prefetched ones handed
// back), and an error matching [ErrChannelClosed] when the channel or its
// connection closed under it. Reconnecting is the caller's loop: open a new
// channel and call Run again. Deliveries whose ack was lost come back, and
// the claim makes them duplicates.
//
// [WithDeliveryContext] derives each delivery's context from the delivery
// before its transaction begins: with OpenTelemetry, extract the
// producer's trace context from the headers there
// (otelmetrics.ContextFromHeaders), and the middleware's span for the
// delivery continues that trace. The package itself imports no tracing
// library.
package rabbitmq
