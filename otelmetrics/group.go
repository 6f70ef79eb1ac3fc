package otelmetrics

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
)

// keyCoalesced marks the span of a coalesced group's transaction.
const keyCoalesced = attribute.Key("idempotent.coalesced")

var _ idempotent.GroupStarter = (*Observer)(nil)

// StartGroup starts the span of one transaction of a coalesced group
// (idempotent.WithCoalescing): one span for the transaction, of kind
// consumer, named "<consumer> process", a root of its own, with one link
// per member to the span of that member's delivery (the adapter's consumer
// span, whose parent is the producer's, or this Observer's delivery span).
// Without a TracerProvider it returns ctx.
func (o *Observer) StartGroup(ctx context.Context, g idempotent.Group) (context.Context, func(error)) {
	if o.tracer == nil {
		return ctx, nil
	}
	links := make([]trace.Link, 0, len(g.Members))
	for _, mb := range g.Members {
		sc := trace.SpanContextFromContext(mb.Ctx)
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{keyKey.String(mb.Key)}})
	}
	ctx, span := o.tracer.Start(ctx, spanName(g.Consumer),
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingConsumerGroupName(g.Consumer),
			semconv.MessagingBatchMessageCount(len(g.Members)),
			keyConsumer.String(g.Consumer),
			keyCoalesced.Bool(true),
		))
	return ctx, func(err error) {
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
