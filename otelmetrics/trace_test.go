package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/otelmetrics"
)

// newTraced returns an Observer whose spans end up in the returned exporter,
// and a tracer of the same provider for the test's own parent spans.
func newTraced(t *testing.T) (*otelmetrics.Observer, *tracetest.InMemoryExporter, trace.Tracer) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider(), otelmetrics.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	return obs, exp, tp.Tracer("test")
}

// attrs returns a span's or event's attributes by key.
func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// wantAttrs fails the test unless got has each of want's attributes.
func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want ...attribute.KeyValue) {
	t.Helper()
	m := attrs(got)
	for _, kv := range want {
		if v, ok := m[kv.Key]; !ok || v != kv.Value {
			t.Errorf("%s: %s = %v (present: %v), want %v", what, kv.Key, v.Emit(), ok, kv.Value.Emit())
		}
	}
}

// spanNamed returns the one ended span named name.
func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1 (all: %v)", len(found), name, exp.GetSpans())
	}
	return found[0]
}

func TestSpanOfAStartedDeliveryWithARetry(t *testing.T) {
	obs, exp, tracer := newTraced(t)
	parentCtx, parent := tracer.Start(context.Background(), "broker")

	ctx := obs.Start(parentCtx, "loyalty", "order-completed:1")
	if got := trace.SpanFromContext(ctx).SpanContext(); !got.IsValid() || got.SpanID() == parent.SpanContext().SpanID() {
		t.Fatalf("Start's context carries span %v, want a new one", got)
	}
	// The handler's own span, started with the delivery's context.
	_, child := tracer.Start(ctx, "handler")
	child.End()
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Key: "order-completed:1", Attempt: 1, Reason: "serialization", Code: "40001", Backoff: 5 * time.Millisecond})
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("%d spans ended before Outcome, want only the handler's", n)
	}
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "order-completed:1", Outcome: idempotent.Applied, Attempts: 2, Duration: 10 * time.Millisecond})
	parent.End()

	s := spanNamed(t, exp, "loyalty process")
	if s.SpanKind != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", s.SpanKind)
	}
	if s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanContext.TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("parent %v, want the caller's span %v", s.Parent, parent.SpanContext())
	}
	if h := spanNamed(t, exp, "handler"); h.Parent.SpanID() != s.SpanContext.SpanID() {
		t.Errorf("the handler's span has parent %v, want the delivery's %v", h.Parent.SpanID(), s.SpanContext.SpanID())
	}
	wantAttrs(t, "span", s.Attributes,
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.consumer.group.name", "loyalty"),
		attribute.String("idempotent.consumer", "loyalty"),
		attribute.String("idempotent.key", "order-completed:1"),
		attribute.String("idempotent.outcome", "applied"),
		attribute.Int("idempotent.attempts", 2),
	)
	if _, ok := attrs(s.Attributes)["error.type"]; ok || s.Status.Code != codes.Unset {
		t.Errorf("an applied delivery has error.type or status %v", s.Status)
	}
	if len(s.Events) != 1 || s.Events[0].Name != "retry" {
		t.Fatalf("events %+v, want one retry", s.Events)
	}
	wantAttrs(t, "retry event", s.Events[0].Attributes,
		attribute.Int("idempotent.retry.attempt", 1),
		attribute.String("idempotent.retry.reason", "serialization"),
		attribute.String("db.response.status_code", "40001"),
		attribute.Float64("idempotent.retry.backoff", 0.005),
	)
	if at := s.Events[0].Time; at.Before(s.StartTime) || at.After(s.EndTime) {
		t.Errorf("retry event at %v, outside the span %v–%v", at, s.StartTime, s.EndTime)
	}
}

func TestSpanOfAFailedDelivery(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&idempotent.RetriesExhaustedError{Attempts: 3, Err: errors.New("40001")}, "retries_exhausted"},
		{fmt.Errorf("idempotent: consumer %q: %w", "loyalty", idempotent.ErrClaimBusy), "claim_busy"},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{fmt.Errorf("wrapped: %w", &handlerError{}), "*otelmetrics_test.handlerError"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			obs, exp, _ := newTraced(t)
			ctx := obs.Start(context.Background(), "loyalty", "k")
			obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "k", Attempts: 3, Err: tc.err})
			s := spanNamed(t, exp, "loyalty process")
			wantAttrs(t, "span", s.Attributes,
				attribute.String("idempotent.outcome", "error"),
				attribute.Int("idempotent.attempts", 3),
				attribute.String("error.type", tc.want),
			)
			if s.Status.Code != codes.Error || s.Status.Description != tc.err.Error() {
				t.Errorf("status %+v, want Error with %q", s.Status, tc.err)
			}
			if len(s.Events) != 1 || s.Events[0].Name != "exception" {
				t.Errorf("events %+v, want the exception", s.Events)
			}
		})
	}
}

type handlerError struct{}

func (*handlerError) Error() string { return "customer blocked" }

// A delivery the middleware did not start — a batch's message, or one whose
// key function failed — gets a span dated back by its duration, under the
// caller's span; a batch's retry is an event of the caller's span.
func TestSpanOfADeliveryNotStarted(t *testing.T) {
	obs, exp, tracer := newTraced(t)
	ctx, parent := tracer.Start(context.Background(), "batch")
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Attempt: 1, Reason: "connection"})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "k1", Outcome: idempotent.Duplicate, Attempts: 2, Duration: time.Hour})
	parent.End()

	s := spanNamed(t, exp, "loyalty process")
	if s.Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("parent %v, want the caller's span", s.Parent)
	}
	if d := s.EndTime.Sub(s.StartTime); d != time.Hour {
		t.Errorf("span from %v to %v (%v), want the delivery's hour", s.StartTime, s.EndTime, d)
	}
	wantAttrs(t, "span", s.Attributes,
		attribute.String("idempotent.key", "k1"),
		attribute.String("idempotent.outcome", "duplicate"),
		attribute.Int("idempotent.attempts", 2),
	)
	b := spanNamed(t, exp, "batch")
	if len(b.Events) != 1 || b.Events[0].Name != "retry" {
		t.Fatalf("the caller's span has events %+v, want the retry", b.Events)
	}
	wantAttrs(t, "retry event", b.Events[0].Attributes, attribute.String("idempotent.retry.reason", "connection"))
	if _, ok := attrs(b.Events[0].Attributes)["db.response.status_code"]; ok {
		t.Error("a retry without SQLSTATE has db.response.status_code")
	}
}

// The handler of one delivery may process messages of another consumer
// (or a batch) with its context: those neither end nor take the outer
// delivery's span.
func TestNestedDeliveriesKeepTheirOwnSpans(t *testing.T) {
	obs, exp, _ := newTraced(t)
	outer := obs.Start(context.Background(), "loyalty", "k")
	obs.Retry(outer, idempotent.RetryEvent{Consumer: "audit", Key: "k2", Attempt: 1, Reason: "serialization"})
	obs.Outcome(outer, idempotent.Event{Consumer: "audit", Key: "k2", Outcome: idempotent.Applied, Attempts: 2})
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("%d spans ended, want only the audit one", n)
	}
	obs.Outcome(outer, idempotent.Event{Consumer: "loyalty", Key: "k", Outcome: idempotent.Applied, Attempts: 1})
	o := spanNamed(t, exp, "loyalty process")
	a := spanNamed(t, exp, "audit process")
	if a.Parent.SpanID() != o.SpanContext.SpanID() {
		t.Errorf("the inner span's parent is %v, want the outer delivery", a.Parent.SpanID())
	}
	if len(a.Events) != 0 || len(o.Events) != 1 {
		// Not started, the inner delivery's retry goes to the span in ctx.
		t.Errorf("events: outer %+v, inner %+v; want the retry on the outer", o.Events, a.Events)
	}
	wantAttrs(t, "outer", o.Attributes, attribute.Int("idempotent.attempts", 1))
}

// Concurrent deliveries each get their own span with their own retries.
func TestConcurrentDeliveries(t *testing.T) {
	obs, exp, _ := newTraced(t)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprint(i)
			ctx := obs.Start(context.Background(), "loyalty", key)
			for a := range i % 4 {
				obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Key: key, Attempt: a + 1, Reason: "serialization", Code: "40001"})
			}
			obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: key, Outcome: idempotent.Applied, Attempts: i%4 + 1})
		})
	}
	wg.Wait()
	spans := exp.GetSpans()
	if len(spans) != n {
		t.Fatalf("%d spans, want %d", len(spans), n)
	}
	for _, s := range spans {
		m := attrs(s.Attributes)
		attempts := int(m["idempotent.attempts"].AsInt64())
		var i int
		fmt.Sscan(m["idempotent.key"].AsString(), &i)
		if attempts != i%4+1 || len(s.Events) != attempts-1 {
			t.Errorf("span of key %d: %d attempts and %d retry events, want %d and %d", i, attempts, len(s.Events), i%4+1, i%4)
		}
	}
}

func TestNoSpansWithoutTracerProvider(t *testing.T) {
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got := obs.Start(ctx, "loyalty", "k"); got != ctx {
		t.Error("Start changed the context of an Observer without traces")
	}
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Key: "k"})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "k", Outcome: idempotent.Applied})
}

func TestNewRejectsBadOptions(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	if _, err := otelmetrics.New(mp, otelmetrics.WithTracerProvider(nil)); err == nil {
		t.Error("WithTracerProvider(nil) accepted")
	}
	if _, err := otelmetrics.New(mp, nil); err == nil {
		t.Error("a nil option accepted")
	}
}

// A delivery's span ends once: a later report with the same context (from a
// goroutine the handler left running, say) gets a span of its own.
func TestSpanEndsOnce(t *testing.T) {
	obs, exp, _ := newTraced(t)
	ctx := obs.Start(context.Background(), "loyalty", "k")
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "k", Outcome: idempotent.Applied, Attempts: 1})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "k", Outcome: idempotent.Duplicate, Attempts: 1})
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	if got := attrs(spans[0].Attributes)["idempotent.outcome"].AsString(); got != "applied" {
		t.Errorf("the delivery's span says %q, want applied", got)
	}
	if spans[1].Parent.SpanID() != spans[0].SpanContext.SpanID() {
		t.Errorf("the later report's span is not under the delivery's")
	}
}
