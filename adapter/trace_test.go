package adapter_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// msgT is a delivery of a test transport: headers and an id.
type msgT struct {
	id      string
	headers map[string]string
}

var traced = adapter.Transport[msgT]{
	Name:        "test",
	DefaultKey:  func(m msgT) (string, error) { return m.id, nil },
	Header:      func(m msgT, name string) (string, bool) { v, ok := m.headers[name]; return v, ok },
	System:      "testmq",
	Destination: func(msgT) string { return "orders" },
	MessageID:   func(m msgT) string { return "id-" + m.id },
}

// recordingTracer records what it was given.
type recordingTracer struct {
	started []adapter.Process
	ended   [][]adapter.Result
}

type ctxKey struct{}

func (r *recordingTracer) Fields() []string { return []string{"traceparent", "baggage"} }

func (r *recordingTracer) StartProcess(ctx context.Context, p adapter.Process) (context.Context, func([]adapter.Result)) {
	r.started = append(r.started, p)
	return context.WithValue(ctx, ctxKey{}, len(r.started)), func(res []adapter.Result) { r.ended = append(r.ended, res) }
}

// TestTraceDescribesTheDeliveries checks what a Tracer is given for one
// delivery and for a batch: the system, each delivery's destination, id,
// key and the trace headers it names (only those present), and each
// delivery's result at the end.
func TestTraceDescribesTheDeliveries(t *testing.T) {
	cfg := adapter.NewConfig(traced)
	ctx, end := cfg.StartTrace(context.Background(), msgT{id: "a"}, idempotent.Message{Key: "a"})
	if ctx.Value(ctxKey{}) != nil {
		t.Fatal("StartTrace without a Tracer changed the context")
	}
	end(idempotent.Applied, nil) // does nothing
	if err := cfg.SetTracer(nil); err == nil {
		t.Fatal("SetTracer(nil) succeeded")
	}
	var tr recordingTracer
	if err := cfg.SetTracer(&tr); err != nil {
		t.Fatal(err)
	}
	a := msgT{id: "a", headers: map[string]string{"traceparent": "00-a", "tracestate": "x=1", "other": "o"}}
	b := msgT{id: "b"}
	ctx, end = cfg.StartTrace(context.Background(), a, idempotent.Message{Key: "a"})
	if ctx.Value(ctxKey{}) != 1 {
		t.Fatal("StartTrace did not return the Tracer's context")
	}
	end(idempotent.Duplicate, nil)
	boom := errors.New("boom")
	_, bend := cfg.StartBatchTrace(context.Background(), []msgT{a, b}, []idempotent.Message{{Key: "a"}, {}})
	bend([]adapter.Result{{Outcome: idempotent.Applied}, {Err: boom}})

	da := adapter.Delivery{Destination: "orders", ID: "id-a", Key: "a", Trace: map[string]string{"traceparent": "00-a"}}
	db := adapter.Delivery{Destination: "orders", ID: "id-b"}
	want := []adapter.Process{
		{System: "testmq", Deliveries: []adapter.Delivery{da}},
		{System: "testmq", Deliveries: []adapter.Delivery{da, db}},
	}
	if !reflect.DeepEqual(tr.started, want) {
		t.Errorf("started\n%+v\nwant\n%+v", tr.started, want)
	}
	wantEnd := [][]adapter.Result{{{Outcome: idempotent.Duplicate}}, {{Outcome: idempotent.Applied}, {Err: boom}}}
	if !reflect.DeepEqual(tr.ended, wantEnd) {
		t.Errorf("ended %+v, want %+v", tr.ended, wantEnd)
	}
}
