package otelmetrics

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
)

// Span attribute keys of the library's own (the messaging and error ones are
// OpenTelemetry's semantic conventions).
const (
	keyConsumer     = attribute.Key("idempotent.consumer")
	keyKey          = attribute.Key("idempotent.key")
	keyOutcome      = attribute.Key("idempotent.outcome")
	keyAttempts     = attribute.Key("idempotent.attempts")
	keyRetryAttempt = attribute.Key("idempotent.retry.attempt")
	keyRetryReason  = attribute.Key("idempotent.retry.reason")
	keyRetryBackoff = attribute.Key("idempotent.retry.backoff")
)

func newTracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
}

// delivery is the span of one started delivery, kept in its context.
type delivery struct {
	span          trace.Span
	consumer, key string
	ended         atomic.Bool
}

type deliveryKey struct{}

// started returns the delivery started in ctx for consumer and key, or nil.
// A context may carry another delivery's span — the handler of one delivery
// may process a batch of another consumer — so both must match.
func started(ctx context.Context, consumer, key string) *delivery {
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	if d == nil || d.consumer != consumer || d.key != key || d.ended.Load() {
		return nil
	}
	return d
}

// Start starts the span of a delivery and returns a context carrying it, for
// the delivery's attempts, handler and reports. Without a TracerProvider it
// returns ctx.
func (o *Observer) Start(ctx context.Context, consumer, key string) context.Context {
	if o.tracer == nil {
		return ctx
	}
	ctx, span := o.tracer.Start(ctx, spanName(consumer), startOptions(consumer, key)...)
	return context.WithValue(ctx, deliveryKey{}, &delivery{span: span, consumer: consumer, key: key})
}

func spanName(consumer string) string { return consumer + " process" }

func startOptions(consumer, key string, more ...trace.SpanStartOption) []trace.SpanStartOption {
	return append([]trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingConsumerGroupName(consumer),
			keyConsumer.String(consumer),
			keyKey.String(key),
		),
	}, more...)
}

// endSpan ends the span of the delivery e reports. A delivery that was not
// started (a batch's message, or one refused before the middleware's loop)
// gets a span now, dated back to its start.
func (o *Observer) endSpan(ctx context.Context, e idempotent.Event, outcome string) {
	var span trace.Span
	var endOpts []trace.SpanEndOption
	if d := started(ctx, e.Consumer, e.Key); d != nil {
		d.ended.Store(true)
		span = d.span
	} else {
		end := time.Now()
		_, span = o.tracer.Start(ctx, spanName(e.Consumer), startOptions(e.Consumer, e.Key, trace.WithTimestamp(end.Add(-e.Duration)))...)
		endOpts = append(endOpts, trace.WithTimestamp(end))
	}
	span.SetAttributes(keyOutcome.String(outcome), keyAttempts.Int(e.Attempts))
	if e.Err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(e.Err)))
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(endOpts...)
}

// retryEvent adds a retry event to the delivery's span or, for a delivery
// that was not started (a batch), to the span recording in ctx, if any.
func (o *Observer) retryEvent(ctx context.Context, e idempotent.RetryEvent) {
	var span trace.Span
	if d := started(ctx, e.Consumer, e.Key); d != nil {
		span = d.span
	} else if span = trace.SpanFromContext(ctx); !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		keyRetryAttempt.Int(e.Attempt),
		keyRetryReason.String(e.Reason),
	}
	if e.Code != "" {
		attrs = append(attrs, semconv.DBResponseStatusCode(e.Code))
	}
	attrs = append(attrs, keyRetryBackoff.Float64(e.Backoff.Seconds()))
	span.AddEvent("retry", trace.WithAttributes(attrs...))
}

// errorType is the span's error.type: the library's condition when the error
// matches one, else the error's Go type.
func errorType(err error) string {
	for _, c := range []struct {
		target error
		name   string
	}{
		{idempotent.ErrRetriesExhausted, "retries_exhausted"},
		{idempotent.ErrClaimBusy, "claim_busy"},
		{idempotent.ErrInvalidKey, "invalid_key"},
		{idempotent.ErrAutocommit, "autocommit"},
		{idempotent.ErrNoClaimTable, "no_claim_table"},
		{idempotent.ErrBeyondRetention, "beyond_retention"},
		{idempotent.ErrInvalidEventTime, "invalid_event_time"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
	} {
		if errors.Is(err, c.target) {
			return c.name
		}
	}
	return semconv.ErrorType(err).Value.AsString()
}
