// Package rabbitmq consumes a RabbitMQ queue (through
// github.com/rabbitmq/amqp091-go) and applies each delivery's database effect
// exactly once with an [idempotent.Middleware], acknowledging late: a
// delivery is acked only after its transaction has committed, for
// [idempotent.Applied] and [idempotent.Duplicate] alike.
//
// A [Consumer] reads one queue with manual acks, a prefetch limit and a fixed
// number of workers, and settles every delivery through the one settle rule
// of every adapter, [adapter.Rule.Settle]:
//
//   - the handler succeeded: ack;
//   - the message is poison — an error marked with [Poison] (or
//     [ErrUndecodable]), one a [WithPoison] predicate recognises, or one the
//     rule calls poison: no key ([ErrNoKey]) or an invalid key
//     ([idempotent.ErrInvalidKey]), older than the retention window
//     ([idempotent.ErrBeyondRetention]), no event time where one is needed
//     ([ErrNoEventTime]), a bad event-time header ([adapter.ErrBadEventTime]),
//     or dated beyond [adapter.DefaultFutureBound] ahead of the clock:
//     reject without requeue, so the broker moves it to the queue's
//     dead-letter exchange (or drops it, if the queue has none);
//   - dated ahead of the Middleware's clock within the bound: hold it up to
//     the requeue delay, then nack with requeue, until the clock has caught
//     up;
//   - any other failure: wait the requeue delay ([WithRequeueDelay], one
//     second by default, jittered), then nack with requeue, so a failing
//     message comes back without spinning. This includes what is not
//     possible yet: a day whose partition MaintainPartitions has not
//     created yet ([idempotent.ErrNoPartition]), a claim held by another
//     delivery ([idempotent.ErrClaimBusy]) and exhausted retries
//     ([idempotent.ErrRetriesExhausted]).
//
// The message key must be an identity the producer assigned — the AMQP
// message_id property ([MessageID]), a header ([Header]) or a field of the
// body ([BodyField]) — never the delivery tag, which the broker assigns per
// delivery, nor any id a broker or relay reassigns when it republishes or
// replays a dead-lettered message.
//
// Event times come from the producer: [Process] and [Decode] read each
// delivery's event time from the [adapter.EventTimeHeader] header
// ("Idempotent-Event-Time", RFC 3339, as adapter.FormatEventTime writes it)
// and run it through idempotent.Middleware.ProcessMessage, so the retention
// fence applies and, in partitioned mode (idempotent.WithDailyPartitions),
// the claim lands in the event day's partition. Like the key, the producer
// sets it once and every re-send keeps it: a re-send on a later day meets
// its claim. [WithEventTime] reads it with a function of yours instead.
// [WithTransportEventTime] reads the AMQP timestamp property, which a
// re-send stamps anew; Process and Decode refuse it for a partitioned
// Middleware with an error matching [adapter.ErrNoProducerEventTime]. On a
// plain table a delivery without the header has no event time and no
// fence; in partitioned mode it is poison. The broker's dead-lettering keeps
// the header, so a replay from the dead-letter queue carries it forward.
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
