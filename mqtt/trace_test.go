package mqtt_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/outbox"
)

// recordingTracer keeps each transaction's Process and results.
type recordingTracer struct {
	mu    sync.Mutex
	procs []adapter.Process
	ends  [][]adapter.Result
}

func (r *recordingTracer) Fields() []string { return []string{"traceparent", "tracestate"} }

func (r *recordingTracer) StartProcess(ctx context.Context, p adapter.Process) (context.Context, func([]adapter.Result)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs = append(r.procs, p)
	i := len(r.procs) - 1
	r.ends = append(r.ends, nil)
	return ctx, func(res []adapter.Result) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ends[i] = res
	}
}

// TestTraceContextThroughMQTT: the Sender puts a row's trace context in
// user properties; the consumer gives the Tracer, for each transaction, the
// system, the topic, the key and that context, then the outcome — applied
// for the first copy, duplicate for the second — per message and in
// batches.
func TestTraceContextThroughMQTT(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		name := map[bool]string{false: "per-message", true: "batch"}[batch]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := brokerAddr(t)
			l := newLedger(t)
			rec := testenv.NewRecorder()
			tr := &recordingTracer{}
			topic := "idempotent/" + testenv.UniqueName("trace")
			id := testenv.UniqueName("tracer")
			openSession(t, addr, id, topic, 1)
			opts := []mqtt.Option{mqtt.WithObserver(rec), mqtt.WithTracer(tr)}
			var c *mqtt.Consumer
			var err error
			if batch {
				c, err = mqtt.NewBatchConsumer(l.mw, l.batchHandler(), append(opts, mqtt.WithBatchSize(1))...)
			} else {
				c, err = mqtt.NewConsumer(l.mw, l.handler(), opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			p := startProc(c, addr, id, topic, 1)
			s, err := mqtt.NewSender(connect(t, addr, testenv.UniqueName("pub"), 0), topic)
			if err != nil {
				t.Fatal(err)
			}
			const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			o := testenv.MakeOrders(1)[0]
			body, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			m := outbox.Message{ID: 1, IdempotencyKey: o.Key(), Payload: body, CreatedAt: time.Now(),
				Trace: map[string]string{"traceparent": parent, "tracestate": "vendor=1"}}
			for range 2 { // a relay whose first acknowledgement was lost
				if err := s.Send(context.Background(), m); err != nil {
					t.Fatal(err)
				}
			}
			rec.Until(t, 60*time.Second, "both copies settled", func() bool {
				return rec.Sum(adapter.EventApplied)+rec.Sum(adapter.EventDuplicate) >= 2
			})
			p.stop(t)
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.procs) != 2 {
				t.Fatalf("%d transactions traced, want 2", len(tr.procs))
			}
			for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
				pr := tr.procs[i]
				if pr.System != "mqtt" || len(pr.Deliveries) != 1 {
					t.Fatalf("transaction %d: system %q, %d deliveries; want mqtt, 1", i, pr.System, len(pr.Deliveries))
				}
				d := pr.Deliveries[0]
				if d.Key != o.Key() || d.Destination != topic || d.Trace["traceparent"] != parent || d.Trace["tracestate"] != "vendor=1" {
					t.Errorf("transaction %d: delivery %+v; want key %s, destination %s, the producer's trace context", i, d, o.Key(), topic)
				}
				if res := tr.ends[i]; len(res) != 1 || res[0].Err != nil || res[0].Outcome != want {
					t.Errorf("transaction %d ended with %+v, want %v", i, res, want)
				}
			}
			testenv.AuditOrders(t, l.db, l.schema, []order{o})
		})
	}
}
