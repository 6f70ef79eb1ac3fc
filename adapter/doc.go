// Package adapter is what every broker adapter of
// github.com/txclaim/idempotent shares — this module's (rabbitmq, kafka,
// nats, watermill) and a third party's: the one header a producer sets a
// message's event time in, and the one rule that turns the Middleware's
// answer into a settlement (ack, requeue after a delay, or poison).
//
// A [Tracer] (package oteltrace gives one for OpenTelemetry) sees every
// transaction a consumer runs, with each delivery's destination, id, key
// and the trace context in its headers, and each one's result: an adapter
// calls [Config.StartTrace] around one delivery's transaction and
// [Config.StartBatchTrace] around a batch's.
//
// # Event times come from the producer
//
// The retention fence and daily partitions rest on a message's event time,
// so it must be a time the producer gave the event and keeps across
// re-sends, like the key. A transport's time — a Kafka record timestamp,
// JetStream's stream time, an AMQP timestamp a broker stamps — is new on
// every re-send: a re-send after UTC midnight would land in another day's
// partition, where its first claim cannot be seen, and apply again. So an
// adapter reads the event time from the producer-set header
// [EventTimeHeader] (or a function over the payload), never from the
// transport unless told to by an option whose doc says what that costs.
// The library's own senders (the outbox senders, the dead-letter senders)
// carry the original event time forward in the same header, to the
// nanosecond (the outbox stores it without loss), so a replay is claimed on
// the original event's day however close to midnight it was.
//
// # One settle rule
//
// [Rule.Settle] is the one place an adapter decides what to do with a
// delivery once the Middleware has answered:
//
//	Applied, Duplicate, Parked                  → Ack
//	the transaction's retryable failures,
//	  ErrClaimBusy, ErrNoPartition, other errors → Requeue after RetryPolicy.Backoff
//	ErrBeyondRetention (too old)                → DeadLetter
//	ErrInvalidKey, a bad event-time header,
//	  ErrInvalidOrder (bad ordering headers),
//	  ErrSkippedSequence,
//	  ErrPoison (Poison, ErrUndecodable)         → DeadLetter
//	ErrAutocommit (the handler left the claim's
//	  transaction: every delivery would again)  → DeadLetter
//	ErrInvalidEventTime, dated in the future:
//	  within Rule.FutureBound                   → Requeue until the clock catches up
//	  beyond it, or zero where one is required  → DeadLetter
//
// DeadLetter means: dead-letter (or terminate) exactly once, nothing written.
// An adapter that bounds redeliveries turns a Requeue past its bound into
// DeadLetter itself.
//
// The future bound is the longest a delivery dated ahead waits for the
// clock. On a queue the others pass it meanwhile, and the bound is
// DefaultFutureBound (an hour). On an ordered transport (Rule.Ordered,
// Transport.Ordered: a Kafka partition, which waits in place for its
// record) everything behind it would wait too, so the bound is the
// Middleware's clock-skew margin: a message dated further ahead — a
// producer whose clock is off by a time zone — is dead-lettered with its
// reason instead of stopping its partition for an hour. Each adapter's
// WithFutureBound sets another bound.
//
// # A database per tenant
//
// With a tenant function (Config.SetTenant, each adapter's WithTenant),
// each delivery goes to its tenant's Middleware in an idempotent.Tenants,
// and a batch is split by tenant, each part claimed and committed in a
// transaction of its own: a tenant whose database is down has its
// deliveries requeued while the others are acked.
package adapter
