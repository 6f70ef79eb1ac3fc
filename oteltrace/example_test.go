package oteltrace_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/oteltrace"
	"github.com/txclaim/idempotent/outbox"
)

// Follow one message without a database or a broker: what outbox.Enqueue
// stores, a relay's attempt, and the consumer's transaction, as the outbox
// and an adapter call the Tracer. In a service, pass the Tracer to
// outbox.WithTracer and to the adapter's WithTracer instead.
func ExampleNew() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tr, err := oteltrace.New(tp)
	if err != nil {
		panic(err)
	}

	ctx, request := tp.Tracer("app").Start(context.Background(), "POST /orders")
	stored := tr.Inject(ctx) // Enqueue stores this with the row
	request.End()

	_, headers, end := tr.StartSend(context.Background(), outbox.Message{Kind: "order-placed", Trace: stored})
	end(nil) // the Sender sent headers with the message

	_, done := tr.StartProcess(context.Background(), adapter.Process{System: "rabbitmq",
		Deliveries: []adapter.Delivery{{Destination: "orders", Key: "order-7", Trace: headers}}})
	done([]adapter.Result{{Outcome: idempotent.Applied}})

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, s.SpanKind, s.SpanContext.TraceID() == request.SpanContext().TraceID())
	}
	// Output:
	// POST /orders internal true
	// order-placed send producer true
	// process orders consumer true
}
