// Package oteltrace traces messages with OpenTelemetry from the
// transaction that writes them to the one that applies them: one trace
// from a producer through the outbox, its relay, the broker and every
// adapter of github.com/txclaim/idempotent to the consumer's effect. It is
// kept out of the root module so that only users who want OpenTelemetry
// import it.
//
// [New] returns a [Tracer] for a TracerProvider. Give it to the outbox with
// outbox.WithTracer and to each consumer with its adapter's WithTracer
// option (rabbitmq.WithTracer, kafka.WithTracer, nats.WithTracer,
// redisstream.WithTracer, cdkpubsub.WithTracer, watermill.WithTracer):
//
//	tr, err := oteltrace.New(otel.GetTracerProvider())
//	ob, err := outbox.New(db, "orders", outbox.WithTracer(tr))
//	c, err := rabbitmq.NewConsumer(mw, h, rabbitmq.WithTracer(tr))
//
// # Spans
//
// Enqueue records the trace context of its caller's ctx (the span of the
// request or of the delivery whose handler enqueues) with the outbox row:
// W3C traceparent, tracestate and baggage, bounded (see outbox.Tracer).
//
// Each attempt of a relay to send a row is a span of kind producer, named
// "<kind> send", whose parent is the context stored with the row:
//
//	messaging.operation.type  "send"
//	messaging.operation.name  "send"
//	messaging.message.id      the call's idempotency key
//	idempotent.consumer       the consumer that enqueued it
//	idempotent.outbox.kind    the row's kind
//	idempotent.outbox.id      the row's id
//	idempotent.outbox.attempt the attempt, from 1
//	error.type                on failure: the error's Go type
//
// The Sender puts the send span's context in the message's headers.
//
// Each transaction of a consumer is a span of kind consumer, named
// "process <destination>" (or "process" where the adapter does not know
// its destination). For one delivery its parent is the producer's context
// found in the delivery's headers, or the context the adapter ran it with
// when there is none; for a batch it is the latter, with one link to each
// delivery's producer context:
//
//	messaging.system               rabbitmq, kafka, nats, redis, watermill, gocloud.dev/pubsub
//	messaging.operation.type       "process"
//	messaging.operation.name       "process"
//	messaging.destination.name     the queue (or exchange), topic, subject or stream
//	messaging.message.id           one delivery's transport id (AMQP message-id,
//	                               Kafka "partition/offset", Nats-Msg-Id, entry id)
//	idempotent.key                 one delivery's key
//	idempotent.outcome             "applied", "duplicate" or "failed"
//	messaging.batch.message_count  a batch's size
//	idempotent.batch.applied       a batch's counts of outcomes
//	idempotent.batch.duplicate
//	idempotent.batch.failed
//	error.type                     on failure (of one delivery: its error; of a
//	                               batch: the first delivery's that failed)
//
// A failed span has status Error with the error's text. A batch's links
// carry messaging.message.id and idempotent.key of their delivery. The
// handler's own spans, and those of idempotent's Middleware when its
// Observer is an otelmetrics.Observer with a TracerProvider, are children
// of the consumer span.
//
// # Propagation
//
// By default the trace context is written and read with the global
// propagator, otel.GetTextMapPropagator, or with W3C Trace Context and
// Baggage while no global one is set; [WithPropagator] sets another. The
// outbox stores the W3C fields only, so a propagator of another format must
// be composed with propagation.TraceContext for the outbox to carry it.
package oteltrace
