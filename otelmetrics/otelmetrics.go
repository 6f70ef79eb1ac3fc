// Package otelmetrics reports the idempotent middleware's outcomes and
// retries as OpenTelemetry metrics. It is kept out of the root package so
// that only users who want OpenTelemetry import it.
//
// The instruments are:
//
//	idempotent.outcomes  counter    consumer, outcome ("applied", "duplicate", "error")
//	idempotent.retries   counter    consumer, reason ("serialization", "connection"), sqlstate
//	idempotent.duration  histogram  consumer, outcome; seconds, retries included
//
// The duplicate share of idempotent.outcomes is the real redelivery rate of a
// broker and consumer.
package otelmetrics

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txclaim/idempotent"
)

// ScopeName is the instrumentation scope of the meter the observer uses.
const ScopeName = "github.com/txclaim/idempotent"

// Observer is an idempotent.Observer that records OpenTelemetry metrics.
type Observer struct {
	outcomes metric.Int64Counter
	retries  metric.Int64Counter
	duration metric.Float64Histogram
}

var _ idempotent.Observer = (*Observer)(nil)

// New returns an Observer recording to a meter of mp. Pass it to the
// middleware with idempotent.WithObserver.
func New(mp metric.MeterProvider) (*Observer, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: nil MeterProvider")
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
	return &o, nil
}

// Outcome records one delivery's outcome and duration.
func (o *Observer) Outcome(ctx context.Context, e idempotent.Event) {
	outcome := "error"
	if e.Err == nil {
		outcome = e.Outcome.String()
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("consumer", e.Consumer),
		attribute.String("outcome", outcome),
	))
	o.outcomes.Add(ctx, 1, attrs)
	o.duration.Record(ctx, e.Duration.Seconds(), attrs)
}

// Retry records one retried attempt.
func (o *Observer) Retry(ctx context.Context, e idempotent.RetryEvent) {
	o.retries.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("consumer", e.Consumer),
		attribute.String("reason", e.Reason),
		attribute.String("sqlstate", e.Code),
	)))
}
