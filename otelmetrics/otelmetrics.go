package otelmetrics

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
)

// ScopeName is the instrumentation scope of the meter and the tracer the
// observer uses.
const ScopeName = "github.com/txclaim/idempotent"

// Observer is an idempotent.Observer that records OpenTelemetry metrics and,
// when given a TracerProvider, spans. It is also an idempotent.Starter, so
// that a delivery's span is started before its first attempt. It is safe for
// concurrent use.
type Observer struct {
	outcomes metric.Int64Counter
	retries  metric.Int64Counter
	duration metric.Float64Histogram
	tracer   trace.Tracer // nil: no spans
}

var (
	_ idempotent.Observer = (*Observer)(nil)
	_ idempotent.Starter  = (*Observer)(nil)
)

// New returns an Observer recording to a meter of mp and, with
// WithTracerProvider, to a tracer. Pass it to the middleware with
// idempotent.WithObserver. For spans without metrics, pass a no-op
// MeterProvider (go.opentelemetry.io/otel/metric/noop).
func New(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: nil MeterProvider")
	}
	var cfg config
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("otelmetrics: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	m := mp.Meter(ScopeName)
	var o Observer
	var err error
	if o.outcomes, err = m.Int64Counter("idempotent.outcomes",
		metric.WithDescription("Deliveries processed, by consumer and outcome (applied, duplicate, error)."),
		metric.WithUnit("{delivery}")); err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	if o.retries, err = m.Int64Counter("idempotent.retries",
		metric.WithDescription("Transactions retried, by consumer, reason and SQLSTATE."),
		metric.WithUnit("{retry}")); err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	if o.duration, err = m.Float64Histogram("idempotent.duration",
		metric.WithDescription("Time to process a delivery, retries included."),
		metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	if cfg.tp != nil {
		o.tracer = newTracer(cfg.tp)
	}
	return &o, nil
}

// Outcome records one delivery's outcome and duration, and ends its span.
func (o *Observer) Outcome(ctx context.Context, e idempotent.Event) {
	outcome := outcomeName(e)
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("consumer", e.Consumer),
		attribute.String("outcome", outcome),
	))
	o.outcomes.Add(ctx, 1, attrs)
	o.duration.Record(ctx, e.Duration.Seconds(), attrs)
	if o.tracer != nil {
		o.endSpan(ctx, e, outcome)
	}
}

// Retry records one retried attempt, as a count and as an event of the
// delivery's span.
func (o *Observer) Retry(ctx context.Context, e idempotent.RetryEvent) {
	o.retries.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("consumer", e.Consumer),
		attribute.String("reason", e.Reason),
		attribute.String("sqlstate", e.Code),
	)))
	if o.tracer != nil {
		o.retryEvent(ctx, e)
	}
}

func outcomeName(e idempotent.Event) string {
	if e.Err != nil {
		return "error"
	}
	return e.Outcome.String()
}
