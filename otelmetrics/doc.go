// Package otelmetrics reports the idempotent middleware to OpenTelemetry:
// metrics of every delivery and retry, and, with [WithTracerProvider], one
// span per delivery. It is kept out of the root package so that only users
// who want OpenTelemetry import it. (The name predates the traces; the
// package reports both.)
//
// Create an [Observer] with [New] and pass it to the middleware with
// idempotent.WithObserver.
//
// # Metrics
//
// The instruments, on the meter named [ScopeName], are:
//
//	idempotent.outcomes  counter    consumer, outcome ("applied", "duplicate", "error")
//	idempotent.retries   counter    consumer, reason ("serialization", "connection"), sqlstate
//	idempotent.duration  histogram  consumer, outcome; seconds, retries included
//
// The duplicate share of idempotent.outcomes is the real redelivery rate of a
// broker and consumer.
//
// [NewGauges] adds observable gauges of the state around the deliveries,
// read at each collection from the sources given: the outbox's backlog and
// the age of its oldest pending row ([Outbox]), parked messages
// ([Parking]), dead letters ([DeadLetters]), the retention horizon's age
// ([Horizon]) and a consumer's lag as its transport counts it
// ([ConsumerLag], fed by kafka.Consumer.Lag, redisstream.Lag or nats.Lag;
// the broker clients stay in the adapters' modules). See [Gauges] for the
// instruments and their attributes.
//
// # Traces
//
// With [WithTracerProvider], each call of ProcessMessage, ProcessNatural or
// ProcessMessageTx (and of WrapMessage, WrapMessageTx and the broker
// adapters built on them) is one span of kind consumer, named "<consumer> process",
// following OpenTelemetry's messaging conventions where they fit:
//
//	messaging.operation.type       "process"
//	messaging.operation.name       "process"
//	messaging.consumer.group.name  the consumer
//	idempotent.consumer            the consumer
//	idempotent.key                 the message key
//	idempotent.outcome             "applied", "duplicate" or "error"
//	idempotent.attempts            transactions run (1 without retries)
//	error.type                     on failure: "retries_exhausted", "claim_busy",
//	                               "invalid_key", "autocommit", "no_claim_table",
//	                               "beyond_retention", "invalid_event_time",
//	                               "canceled", "deadline_exceeded", or the
//	                               error's Go type
//
// A failed delivery's span has status Error with the error's text, and the
// error recorded as an exception event. Each retried attempt is an event
// named "retry", stamped when the attempt failed, with the attributes
// idempotent.retry.attempt (the failed attempt, from 1),
// idempotent.retry.reason ("serialization" or "connection"),
// db.response.status_code (the SQLSTATE, when the failure carried one) and
// idempotent.retry.backoff (the sleep before the next attempt, in seconds).
//
// The span starts before the first attempt (the Observer is an
// idempotent.Starter) and the attempts run with its context, so the
// handler's own spans — those of an instrumented SQL driver, say — are its
// children. Its parent is the span in the caller's context: the broker
// adapter's or the application's, or a producer's span carried in the
// message.
//
// An Observer of your own that passes reports on to this one must also pass
// Start on (implement idempotent.Starter) for the span to start before the
// attempts; otherwise spans are made as for a batch, below.
//
// ProcessMessages, ProcessMessagesTx, WrapMessages and WrapMessagesTx
// report one span per message, started at the
// batch's start and ended with it; their retries are events on the span in
// the caller's context, if one is recording.
//
// # Coalesced groups
//
// Under idempotent.WithCoalescing (and an adapter's coalesced deliveries,
// such as the Kafka consumer's), each transaction of a group is one more
// span (the Observer is an idempotent.GroupStarter): kind consumer, named
// "<consumer> process", a root of its own, with idempotent.coalesced true,
// messaging.batch.message_count the members it runs, and one link per
// member, with the member's idempotent.key, to the span of the member's
// context — its delivery span, whose parent is the producer's span carried
// in the message. A transaction that does not commit (retried, or run
// again without a member that failed on its own) ends with status Error.
//
// # Continuing a producer's trace
//
// A producer that injects its trace context into the message's headers
// (a W3C traceparent, say) lets the delivery's span continue its trace.
// [HeaderCarrier] reads and writes such headers — an amqp091 Table, or any
// map of header names to string or []byte values — for an OpenTelemetry
// propagator, and [ContextFromHeaders] extracts the trace context with the
// global propagator. With the rabbitmq adapter, derive each delivery's
// context from its headers with rabbitmq.WithDeliveryContext:
//
//	rabbitmq.WithDeliveryContext(func(ctx context.Context, d *amqp.Delivery) context.Context {
//		return otelmetrics.ContextFromHeaders(ctx, d.Headers)
//	})
//
// The global propagator does nothing until the application sets one, for
// example with otel.SetTextMapPropagator(propagation.TraceContext{}).
package otelmetrics
