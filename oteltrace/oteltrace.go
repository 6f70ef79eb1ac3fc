package oteltrace

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// ScopeName is the instrumentation scope of the tracer.
const ScopeName = "github.com/txclaim/idempotent/oteltrace"

// Span attribute keys of the library's own (the messaging and error ones are
// OpenTelemetry's semantic conventions).
const (
	keyConsumer       = attribute.Key("idempotent.consumer")
	keyKey            = attribute.Key("idempotent.key")
	keyOutcome        = attribute.Key("idempotent.outcome")
	keyOutboxKind     = attribute.Key("idempotent.outbox.kind")
	keyOutboxID       = attribute.Key("idempotent.outbox.id")
	keyOutboxAttempt  = attribute.Key("idempotent.outbox.attempt")
	keyBatchApplied   = attribute.Key("idempotent.batch.applied")
	keyBatchDuplicate = attribute.Key("idempotent.batch.duplicate")
	keyBatchFailed    = attribute.Key("idempotent.batch.failed")
)

// Tracer records the spans of the outbox's relays and of the adapters'
// consumers, and carries the trace context between them. It is an
// outbox.Tracer and an adapter.Tracer; one serves every outbox and every
// consumer of an application. It is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator // nil: the global one
}

var (
	_ outbox.Tracer  = (*Tracer)(nil)
	_ adapter.Tracer = (*Tracer)(nil)
)

// An Option configures a Tracer. Options are checked by New: a bad value
// is an error from New.
type Option interface {
	apply(*Tracer) error
}

type optionFunc func(*Tracer) error

func (f optionFunc) apply(t *Tracer) error { return f(t) }

// WithPropagator sets the propagator that writes the trace context into
// the outbox row and the messages' headers, and reads it back. Default is
// the global one (otel.GetTextMapPropagator), or W3C Trace Context and
// Baggage while none is set.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(t *Tracer) error {
		if p == nil {
			return errors.New("oteltrace: WithPropagator: nil propagator")
		}
		t.prop = p
		return nil
	})
}

// New returns a Tracer recording with a tracer of tp. Pass
// otel.GetTracerProvider() for the global one.
func New(tp trace.TracerProvider, opts ...Option) (*Tracer, error) {
	if tp == nil {
		return nil, errors.New("oteltrace: New: nil TracerProvider")
	}
	t := &Tracer{tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("oteltrace: New: nil option")
		}
		if err := o.apply(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// w3c is the propagator used while no global one is set.
var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// propagator is the propagator to use now.
func (t *Tracer) propagator() propagation.TextMapPropagator {
	if t.prop != nil {
		return t.prop
	}
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return w3c
}

// Inject returns the trace context of ctx, to be stored with an outbox row.
func (t *Tracer) Inject(ctx context.Context) map[string]string {
	c := propagation.MapCarrier{}
	t.propagator().Inject(ctx, c)
	return c
}

// StartSend starts the span of one attempt of a relay to send m, a child of
// the context stored with m's row, and returns the trace context the Sender
// puts in the message's headers: the send span's.
func (t *Tracer) StartSend(ctx context.Context, m outbox.Message) (context.Context, map[string]string, func(error)) {
	p := t.propagator()
	ctx = p.Extract(ctx, propagation.MapCarrier(m.Trace))
	ctx, span := t.tracer.Start(ctx, m.Kind+" send",
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingMessageID(m.IdempotencyKey),
			keyConsumer.String(m.Consumer),
			keyOutboxKind.String(m.Kind),
			keyOutboxID.Int64(m.ID),
			keyOutboxAttempt.Int(m.Attempt),
		))
	out := propagation.MapCarrier{}
	p.Inject(ctx, out)
	return ctx, out, func(err error) {
		if err != nil {
			fail(span, err)
		}
		span.End()
	}
}

// Fields returns the header names the propagator reads.
func (t *Tracer) Fields() []string { return t.propagator().Fields() }

// StartProcess starts the consumer span of one transaction: for one
// delivery a child of the producer's context in its headers, for a batch a
// span with a link to each delivery's producer context.
func (t *Tracer) StartProcess(ctx context.Context, pr adapter.Process) (context.Context, func([]adapter.Result)) {
	p := t.propagator()
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(pr.System),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
	}
	dest := destination(pr.Deliveries)
	if dest != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	single := len(pr.Deliveries) == 1
	if single {
		d := pr.Deliveries[0]
		if d.Trace != nil {
			ctx = p.Extract(ctx, propagation.MapCarrier(d.Trace))
		}
		if d.ID != "" {
			attrs = append(attrs, semconv.MessagingMessageID(d.ID))
		}
		if d.Key != "" {
			attrs = append(attrs, keyKey.String(d.Key))
		}
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(pr.Deliveries)))
		for _, d := range pr.Deliveries {
			if d.Trace == nil {
				continue
			}
			sc := trace.SpanContextFromContext(p.Extract(context.Background(), propagation.MapCarrier(d.Trace)))
			if !sc.IsValid() {
				continue
			}
			var la []attribute.KeyValue
			if d.ID != "" {
				la = append(la, semconv.MessagingMessageID(d.ID))
			}
			if d.Key != "" {
				la = append(la, keyKey.String(d.Key))
			}
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: la}))
		}
	}
	name := "process"
	if dest != "" {
		name += " " + dest
	}
	ctx, span := t.tracer.Start(ctx, name, append(opts, trace.WithAttributes(attrs...))...)
	return ctx, func(res []adapter.Result) {
		if single && len(res) == 1 {
			span.SetAttributes(keyOutcome.String(outcome(res[0])))
			if res[0].Err != nil {
				fail(span, res[0].Err)
			}
			span.End()
			return
		}
		var applied, dup, failed int
		var first error
		for _, r := range res {
			switch outcome(r) {
			case "applied":
				applied++
			case "duplicate":
				dup++
			default:
				failed++
				if first == nil {
					first = r.Err
				}
			}
		}
		span.SetAttributes(keyBatchApplied.Int(applied), keyBatchDuplicate.Int(dup), keyBatchFailed.Int(failed))
		if first != nil {
			fail(span, first)
		}
		span.End()
	}
}

// destination is the deliveries' destination when they share one, else "".
func destination(ds []adapter.Delivery) string {
	if len(ds) == 0 {
		return ""
	}
	d := ds[0].Destination
	for _, o := range ds[1:] {
		if o.Destination != d {
			return ""
		}
	}
	return d
}

// outcome names a delivery's result: "applied", "duplicate" or "failed".
func outcome(r adapter.Result) string {
	switch {
	case r.Err != nil:
		return "failed"
	case r.Outcome == idempotent.Applied:
		return "applied"
	case r.Outcome == idempotent.Duplicate:
		return "duplicate"
	}
	return "failed"
}

// fail marks span failed with err.
func fail(span trace.Span, err error) {
	span.SetAttributes(semconv.ErrorType(err))
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
