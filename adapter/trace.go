package adapter

import (
	"context"
	"errors"

	"github.com/txclaim/idempotent"
)

// A Tracer traces an adapter's deliveries (package oteltrace implements one
// for OpenTelemetry): each transaction a consumer runs — one delivery's, a
// batch's — is one span, which continues the trace of the producer whose
// context the deliveries carry in their headers. Give one to an adapter
// with its WithTracer option.
type Tracer interface {
	// Fields are the names of the headers the trace context travels in,
	// such as "traceparent", "tracestate" and "baggage" (the ones the
	// outbox stores and its senders set). The adapter reads them from each
	// delivery into Delivery.Trace.
	Fields() []string
	// StartProcess starts the span of one transaction processing p's
	// deliveries and returns the context the transaction and its handler
	// run with, and a function the adapter calls once, with each
	// delivery's result in the order of p.Deliveries, when the Middleware
	// has answered (before the deliveries are settled).
	StartProcess(ctx context.Context, p Process) (context.Context, func(results []Result))
}

// Process is what one transaction of a consumer processes, for a Tracer.
type Process struct {
	// System is the messaging system, as OpenTelemetry's
	// messaging.system names it: "rabbitmq", "kafka", "nats", "redis",
	// "gcp_pubsub", "watermill"…
	System string
	// Deliveries are the transaction's deliveries: one, or a batch's.
	Deliveries []Delivery
}

// Delivery is one delivery of a Process.
type Delivery struct {
	// Destination is where it was consumed from: a queue, topic, subject
	// or stream; "" when unknown.
	Destination string
	// ID is the transport's message id, if it has one (an AMQP
	// message-id, a Kafka partition and offset, a stream entry id).
	ID string
	// Key is the message's key, as the consumer claims it; "" when it
	// could not be read.
	Key string
	// Trace holds the delivery's headers named by Tracer.Fields that it
	// carries; nil when none.
	Trace map[string]string
}

// SetTracer sets the Tracer (the WithTracer option).
func (c *Config[T]) SetTracer(t Tracer) error {
	if t == nil {
		return errors.New("WithTracer: nil Tracer")
	}
	c.tracer = t
	return nil
}

// Tracer is the Tracer set, or nil.
func (c *Config[T]) Tracer() Tracer { return c.tracer }

// StartTrace starts the Tracer's span of the transaction that processes
// delivery d, whose Message (as Config.Message read it) is msg. It returns
// ctx and an end function that does nothing when no Tracer is set.
func (c *Config[T]) StartTrace(ctx context.Context, d T, msg idempotent.Message) (context.Context, func(idempotent.Outcome, error)) {
	if c.tracer == nil {
		return ctx, func(idempotent.Outcome, error) {}
	}
	ctx, end := c.tracer.StartProcess(ctx, Process{System: c.tr.System, Deliveries: []Delivery{c.delivery(d, msg)}})
	return ctx, func(out idempotent.Outcome, err error) { end([]Result{{Outcome: out, Err: err}}) }
}

// StartBatchTrace starts the Tracer's span of the transaction that
// processes the deliveries ds of a batch, whose Messages are msgs (as for
// ProcessBatch). It returns ctx and an end function, to be called with
// ProcessBatch's results, that does nothing when no Tracer is set.
func (c *Config[T]) StartBatchTrace(ctx context.Context, ds []T, msgs []idempotent.Message) (context.Context, func([]Result)) {
	if c.tracer == nil {
		return ctx, func([]Result) {}
	}
	p := Process{System: c.tr.System, Deliveries: make([]Delivery, len(ds))}
	for i, d := range ds {
		p.Deliveries[i] = c.delivery(d, msgs[i])
	}
	return c.tracer.StartProcess(ctx, p)
}

// delivery describes d, whose Message is msg, for the Tracer.
func (c *Config[T]) delivery(d T, msg idempotent.Message) Delivery {
	out := Delivery{Key: msg.Key}
	if c.tr.Destination != nil {
		out.Destination = c.tr.Destination(d)
	}
	if c.tr.MessageID != nil {
		out.ID = c.tr.MessageID(d)
	}
	if c.tr.Header == nil {
		return out
	}
	for _, f := range c.tracer.Fields() {
		if v, ok := c.tr.Header(d, f); ok && v != "" {
			if out.Trace == nil {
				out.Trace = map[string]string{}
			}
			out.Trace[f] = v
		}
	}
	return out
}
