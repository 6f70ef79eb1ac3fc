package tests

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
)

// A coalesced group's transaction is one span, with one link per member to
// that member's delivery span, whose parent is the producer's send span
// carried in the message's headers (here extracted with the W3C
// propagator, as an adapter does). The core's database/sql groups and
// idempgx's pgx groups alike.

const groupSize = 8

// groupRound runs groupSize deliveries concurrently through process, each
// with the context extracted from a producer's headers, and returns the
// producers' send spans by key.
func groupRound(t *testing.T, test trace.Tracer, round int, process func(ctx context.Context, key string) error) map[string]trace.SpanContext {
	t.Helper()
	w3c := propagation.TraceContext{}
	sends := map[string]trace.SpanContext{}
	ctxs := map[string]context.Context{}
	for i := range groupSize {
		key := fmt.Sprintf("order-%d-%d", round, i)
		pctx, send := test.Start(context.Background(), "order-placed send", trace.WithSpanKind(trace.SpanKindProducer))
		headers := propagation.MapCarrier{}
		w3c.Inject(pctx, headers)
		send.End()
		sends[key] = send.SpanContext()
		ctxs[key] = w3c.Extract(context.Background(), headers)
	}
	var wg sync.WaitGroup
	errs := make(chan error, groupSize)
	for key, ctx := range ctxs {
		wg.Go(func() { errs <- process(ctx, key) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return sends
}

// wantGroupSpan checks the spans of one round (sends): it reports false
// when the round's deliveries did not all meet in one group (a group
// closes Coalescing.Wait after its first member came, and the machine may
// be slower); otherwise it checks the group's span: one, of consumer's,
// with one link per member, each to that member's delivery span, whose
// parent is that member's producer span — or, when started is false (a
// Middleware that does not start its delivery spans before the
// transaction: idempgx), to the producer's span, the delivery's context.
func wantGroupSpan(t *testing.T, exp *tracetest.InMemoryExporter, consumer string, started bool, sends map[string]trace.SpanContext) bool {
	t.Helper()
	deliveries := map[trace.SpanID]tracetest.SpanStub{}
	var groups []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		a := spanAttrs(s.Attributes)
		switch {
		case s.Name != consumer+" process":
		case a["idempotent.coalesced"] == "true":
			if _, mine := sends[spanAttrs(s.Links[0].Attributes)["idempotent.key"]]; len(s.Links) > 0 && mine {
				groups = append(groups, s)
			}
		default:
			if _, mine := sends[a["idempotent.key"]]; mine {
				deliveries[s.SpanContext.SpanID()] = s
			}
		}
	}
	if len(deliveries) != groupSize {
		t.Fatalf("%d delivery spans, want %d", len(deliveries), groupSize)
	}
	if len(groups) != 1 || len(groups[0].Links) != groupSize {
		return false
	}
	g := groups[0]
	a := spanAttrs(g.Attributes)
	if g.SpanKind != trace.SpanKindConsumer || g.Parent.IsValid() || a["messaging.batch.message_count"] != fmt.Sprint(groupSize) ||
		a["messaging.operation.type"] != "process" || a["idempotent.consumer"] != consumer {
		t.Errorf("group span: kind %v, parent %v, attributes %v; want a root consumer span of %s with %d messages", g.SpanKind, g.Parent.SpanID(), a, consumer, groupSize)
	}
	seen := map[string]bool{}
	for _, l := range g.Links {
		key := spanAttrs(l.Attributes)["idempotent.key"]
		seen[key] = true
		if !started {
			if l.SpanContext.SpanID() != sends[key].SpanID() || l.SpanContext.TraceID() != sends[key].TraceID() {
				t.Errorf("link of %s to %v, want its producer's span %v", key, l.SpanContext.SpanID(), sends[key].SpanID())
			}
			continue
		}
		d, ok := deliveries[l.SpanContext.SpanID()]
		switch {
		case !ok:
			t.Errorf("link of %s to %v: not a delivery span", key, l.SpanContext.SpanID())
		case spanAttrs(d.Attributes)["idempotent.key"] != key || spanAttrs(d.Attributes)["idempotent.outcome"] != "applied":
			t.Errorf("link of %s to the delivery span of %v", key, spanAttrs(d.Attributes))
		case d.Parent.SpanID() != sends[key].SpanID() || d.SpanContext.TraceID() != sends[key].TraceID():
			t.Errorf("delivery span of %s: parent %v, want its producer's %v", key, d.Parent.SpanID(), sends[key].SpanID())
		}
	}
	if len(seen) != groupSize {
		t.Errorf("links to %d keys, want %d", len(seen), groupSize)
	}
	return true
}

// groupRounds runs rounds until the deliveries of one met in one group
// (the first, as a rule), at most five.
func groupRounds(t *testing.T, exp *tracetest.InMemoryExporter, test trace.Tracer, consumer string, started bool, process func(ctx context.Context, key string) error) {
	t.Helper()
	for round := range 5 {
		if wantGroupSpan(t, exp, consumer, started, groupRound(t, test, round, process)) {
			return
		}
	}
	t.Fatalf("in five rounds, %d concurrent deliveries never met in one group", groupSize)
}

var groupCoalescing = idempotent.Coalescing{Max: groupSize, Wait: time.Second}

func TestTraceOfACoalescedGroup(t *testing.T) {
	t.Parallel()
	obs, exp, test := tracing(t)
	db := openDB(t)
	schema := tempSchema(t, db)
	mw, err := idempotent.New(db, postgres.New(), "shipping", idempotent.WithTable(schema+".processed_messages"),
		idempotent.WithObserver(obs), idempotent.WithCoalescing(groupCoalescing))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	groupRounds(t, exp, test, "shipping", true, func(ctx context.Context, key string) error {
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { return nil })
		return err
	})
}

func TestTraceOfACoalescedPgxGroup(t *testing.T) {
	t.Parallel()
	obs, exp, test := tracing(t)
	db := openDB(t)
	schema := tempSchema(t, db)
	pool, err := pgxpool.New(context.Background(), pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mw, err := idempgx.New(pool, "billing", idempgx.WithTable(schema+".processed_messages"),
		idempgx.WithObserver(obs), idempgx.WithCoalescing(groupCoalescing))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	groupRounds(t, exp, test, "billing", false, func(ctx context.Context, key string) error {
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(context.Context, pgx.Tx) error { return nil })
		return err
	})
}
