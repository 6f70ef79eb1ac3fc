package oteltrace_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/oteltrace"
	"github.com/txclaim/idempotent/outbox"
)

// newTracer returns a Tracer whose spans end up in the returned exporter,
// and a tracer of the same provider for the test's own spans.
func newTracer(t *testing.T) (*oteltrace.Tracer, *tracetest.InMemoryExporter, trace.Tracer) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr, err := oteltrace.New(tp)
	if err != nil {
		t.Fatal(err)
	}
	return tr, exp, tp.Tracer("test")
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// wantAttrs fails the test unless got has each attribute of want.
func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]string) {
	t.Helper()
	m := attrs(got)
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, m[k], v)
		}
	}
}

// TestOutboxToConsumer follows one message without a broker: the
// enqueueing span's context stored (Inject), a relay's send span (a child
// of it, kind producer), the context the sender sends, and the consumer's
// span (a child of the send span, kind consumer) saying applied.
func TestOutboxToConsumer(t *testing.T) {
	tr, exp, test := newTracer(t)
	ctx, request := test.Start(context.Background(), "request")
	stored := tr.Inject(ctx)
	request.End()
	if stored[outbox.TraceParentHeader] == "" {
		t.Fatalf("Inject stored %v, want a traceparent", stored)
	}
	m := outbox.Message{ID: 7, Consumer: "orders", Kind: "order-placed", IdempotencyKey: "ik", Attempt: 1, Trace: stored}
	_, sent, end := tr.StartSend(context.Background(), m)
	end(nil)
	_, endProcess := tr.StartProcess(context.Background(), adapter.Process{System: "rabbitmq", Deliveries: []adapter.Delivery{
		{Destination: "orders", ID: "ik", Key: "ik", Trace: sent},
	}})
	endProcess([]adapter.Result{{Outcome: idempotent.Applied}})

	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3: %v", len(spans), spans)
	}
	req, send, proc := spans[0], spans[1], spans[2]
	if send.Name != "order-placed send" || send.SpanKind != trace.SpanKindProducer {
		t.Errorf("send span %q kind %v", send.Name, send.SpanKind)
	}
	if send.Parent.SpanID() != req.SpanContext.SpanID() || send.SpanContext.TraceID() != req.SpanContext.TraceID() {
		t.Errorf("send span's parent %v, want the request's %v", send.Parent, req.SpanContext)
	}
	if proc.Name != "process orders" || proc.SpanKind != trace.SpanKindConsumer {
		t.Errorf("process span %q kind %v", proc.Name, proc.SpanKind)
	}
	if proc.Parent.SpanID() != send.SpanContext.SpanID() || proc.SpanContext.TraceID() != req.SpanContext.TraceID() {
		t.Errorf("process span's parent %v, want the send span %v", proc.Parent, send.SpanContext)
	}
	wantAttrs(t, "send", send.Attributes, map[attribute.Key]string{
		"messaging.operation.type": "send", "messaging.message.id": "ik", "idempotent.outbox.kind": "order-placed",
		"idempotent.outbox.id": "7", "idempotent.outbox.attempt": "1", "idempotent.consumer": "orders",
	})
	wantAttrs(t, "process", proc.Attributes, map[attribute.Key]string{
		"messaging.system": "rabbitmq", "messaging.operation.type": "process", "messaging.destination.name": "orders",
		"messaging.message.id": "ik", "idempotent.key": "ik", "idempotent.outcome": "applied",
	})
}

// TestFailedSendAndDuplicate checks a failed attempt's send span and a
// duplicate's and a failure's process spans.
func TestFailedSendAndDuplicate(t *testing.T) {
	tr, exp, _ := newTracer(t)
	_, _, end := tr.StartSend(context.Background(), outbox.Message{Kind: "k", Attempt: 2})
	end(errors.New("provider down"))
	for _, r := range []adapter.Result{{Outcome: idempotent.Duplicate}, {Err: errors.New("boom")}} {
		_, endProcess := tr.StartProcess(context.Background(), adapter.Process{System: "kafka", Deliveries: []adapter.Delivery{{Key: "k"}}})
		endProcess([]adapter.Result{r})
	}
	spans := exp.GetSpans()
	if s := spans[0]; s.Status.Code != codes.Error || s.Status.Description != "provider down" {
		t.Errorf("failed send's status %+v", s.Status)
	}
	if s := spans[1]; s.Name != "process" || attrs(s.Attributes)["idempotent.outcome"] != "duplicate" || s.Status.Code != codes.Unset {
		t.Errorf("duplicate's span %q %v status %v", s.Name, attrs(s.Attributes), s.Status)
	}
	if s := spans[2]; attrs(s.Attributes)["idempotent.outcome"] != "failed" || s.Status.Code != codes.Error {
		t.Errorf("failure's span %v status %v", attrs(s.Attributes), s.Status)
	}
}

// TestBatchLinks checks that a batch of 50 deliveries, each from a producer
// span of its own, is one span with 50 links, one to each producer span,
// and counts of its outcomes.
func TestBatchLinks(t *testing.T) {
	tr, exp, test := newTracer(t)
	const n = 50
	ds := make([]adapter.Delivery, n)
	res := make([]adapter.Result, n)
	producers := map[trace.SpanID]string{}
	for i := range ds {
		ctx, span := test.Start(context.Background(), "produce")
		key := fmt.Sprintf("k%d", i)
		ds[i] = adapter.Delivery{Destination: "orders", ID: key, Key: key, Trace: tr.Inject(ctx)}
		producers[span.SpanContext().SpanID()] = key
		span.End()
		res[i].Outcome = idempotent.Applied
		if i%10 == 0 {
			res[i].Outcome = idempotent.Duplicate
		}
	}
	_, end := tr.StartProcess(context.Background(), adapter.Process{System: "nats", Deliveries: ds})
	end(res)
	spans := exp.GetSpans()
	batch := spans[len(spans)-1]
	if batch.Name != "process orders" || batch.Parent.IsValid() {
		t.Errorf("batch span %q with parent %v, want a root", batch.Name, batch.Parent)
	}
	if len(batch.Links) != n {
		t.Fatalf("%d links, want %d", len(batch.Links), n)
	}
	for _, l := range batch.Links {
		key, ok := producers[l.SpanContext.SpanID()]
		if !ok || attrs(l.Attributes)["idempotent.key"] != key {
			t.Errorf("link to %v (%v) is to no producer span", l.SpanContext.SpanID(), attrs(l.Attributes))
		}
		delete(producers, l.SpanContext.SpanID())
	}
	wantAttrs(t, "batch", batch.Attributes, map[attribute.Key]string{
		"messaging.batch.message_count": "50", "idempotent.batch.applied": "45", "idempotent.batch.duplicate": "5", "idempotent.batch.failed": "0",
	})
}

func TestNewRefusesNil(t *testing.T) {
	if _, err := oteltrace.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := oteltrace.New(sdktrace.NewTracerProvider(), oteltrace.WithPropagator(nil)); err == nil {
		t.Error("WithPropagator(nil) succeeded")
	}
}
