package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// batchLog records the batches a BatchHandler was given, by message id.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string
}

func (b *batchLog) add(ds []*amqp.Delivery) {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.MessageId
	}
	b.mu.Lock()
	b.batches = append(b.batches, ids)
	b.mu.Unlock()
}

func (b *batchLog) all() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.batches)
}

// runBatch delivers ds, then runs a batch consumer of h over them until
// n deliveries are settled, and returns the events.
func runBatch(t *testing.T, h rabbitmq.BatchHandler, ds []amqp.Delivery, n int, opts ...rabbitmq.Option) (*recorder, *fakeChannel, *claimDB) {
	t.Helper()
	mw, db := newMiddleware(t)
	db.claims["known"] = true // applied before
	var rec recorder
	c, err := rabbitmq.NewBatchConsumer(mw, h, append([]rabbitmq.Option{rabbitmq.WithObserver(&rec), rabbitmq.WithBatchSize(10),
		rabbitmq.WithRetryDelay(time.Millisecond, time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeChannel()
	for _, d := range ds {
		f.deliver(d) // all received before Run: one batch
	}
	stop, _ := start(t, c, f)
	waitFor(t, fmt.Sprintf("%d settlements", n), func() bool {
		return len(rec.all(adapter.EventApplied, adapter.EventDuplicate, adapter.EventRequeued, adapter.EventDeadLettered)) >= n
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return &rec, f, db
}

// types returns each message id's settlement types.
func types(rec *recorder) map[string][]adapter.EventType {
	out := map[string][]adapter.EventType{}
	for _, e := range rec.all() {
		id := e.Detail.(*amqp.Delivery).MessageId
		out[id] = append(out[id], e.Type)
	}
	return out
}

func TestBatchClaimsTogetherAndSettlesEachDelivery(t *testing.T) {
	t.Parallel()
	var log batchLog
	h := func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error {
		log.add(ds)
		for _, d := range ds {
			if err := effect(ctx, tx, d); err != nil {
				return err
			}
		}
		return nil
	}
	ids := []string{"a", "known", "b", "a", "c"}
	var ds []amqp.Delivery
	for _, id := range ids {
		ds = append(ds, amqp.Delivery{MessageId: id})
	}
	rec, f, db := runBatch(t, h, ds, len(ds))
	if got := log.all(); len(got) != 1 || !slices.Equal(got[0], []string{"a", "b", "c"}) {
		t.Fatalf("batches %q, want one with the fresh deliveries a, b, c in their order", got)
	}
	want := map[string][]adapter.EventType{
		"a": {adapter.EventApplied, adapter.EventDuplicate}, "known": {adapter.EventDuplicate},
		"b": {adapter.EventApplied}, "c": {adapter.EventApplied},
	}
	if got := types(rec); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("settlements %v, want %v", got, want)
	}
	for tag := 1; tag <= len(ds); tag++ {
		if !slices.Contains(f.log(), fmt.Sprintf("ack %d", tag)) {
			t.Fatalf("events %q: delivery %d not acked on its own", f.log(), tag)
		}
	}
	if n := len(db.committed()); n != 3 {
		t.Fatalf("%d effects committed, want 3", n)
	}
}

// A delivery refused before any transaction (no key, dated beyond the
// bound) is settled alone; one the handler sets aside with PoisonItem is
// dead-lettered alone and the rest claimed again without it.
func TestBatchSetsPoisonAside(t *testing.T) {
	t.Parallel()
	var log batchLog
	h := func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error {
		log.add(ds)
		for i, d := range ds {
			if strings.HasPrefix(d.MessageId, "bad") {
				return adapter.PoisonItem(i, fmt.Errorf("no customer for %s", d.MessageId))
			}
			if err := effect(ctx, tx, d); err != nil {
				return err
			}
		}
		return nil
	}
	far := adapter.FormatEventTime(time.Now().Add(3 * adapter.DefaultFutureBound))
	ds := []amqp.Delivery{
		{MessageId: "a"}, {}, {MessageId: "bad-1"}, {MessageId: "b"},
		{MessageId: "far", Headers: amqp.Table{adapter.EventTimeHeader: far}}, {MessageId: "bad-2"}, {MessageId: "c"},
	}
	rec, f, db := runBatch(t, h, ds, len(ds))
	want := [][]string{{"a", "bad-1", "b", "bad-2", "c"}, {"a", "b", "bad-2", "c"}, {"a", "b", "c"}}
	if got := log.all(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batches %q, want %q", got, want)
	}
	got := types(rec)
	for _, id := range []string{"", "bad-1", "far", "bad-2"} {
		if !slices.Equal(got[id], []adapter.EventType{adapter.EventDeadLettered}) {
			t.Errorf("%q settled %v, want dead-lettered once", id, got[id])
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if !slices.Equal(got[id], []adapter.EventType{adapter.EventApplied}) {
			t.Errorf("%q settled %v, want applied once", id, got[id])
		}
	}
	for _, e := range rec.all(adapter.EventDeadLettered) {
		if id := e.Detail.(*amqp.Delivery).MessageId; strings.HasPrefix(id, "bad") && !errors.Is(e.Err, adapter.ErrPoison) {
			t.Errorf("%s dead-lettered with %v, want the handler's poison", id, e.Err)
		}
	}
	if n, rejects := len(db.committed()), strings.Count(strings.Join(f.log(), ","), "reject"); n != 3 || rejects != 4 {
		t.Fatalf("%d effects committed and %d rejects, want 3 and 4", n, rejects)
	}
}

// A failure of the whole batch requeues each delivery, after one wait.
func TestBatchFailureRequeuesEach(t *testing.T) {
	t.Parallel()
	const delay = 40 * time.Millisecond
	h := func(context.Context, *sql.Tx, []*amqp.Delivery) error { return errors.New("pricing service down") }
	ds := []amqp.Delivery{{MessageId: "a"}, {MessageId: "known"}, {MessageId: "b"}}
	start := time.Now()
	rec, _, db := runBatch(t, h, ds, len(ds), rabbitmq.WithRetryDelay(delay, delay))
	if took := time.Since(start); took > 10*delay {
		t.Fatalf("three requeues took %v, want one wait of at most %v", took, delay)
	}
	evs := rec.all()
	if len(evs) != 3 {
		t.Fatalf("events %+v, want three requeues", evs)
	}
	for _, e := range evs {
		if e.Type != adapter.EventRequeued || e.Delay < delay/2 || e.Delay > delay || !strings.Contains(fmt.Sprint(e.Err), "pricing service down") {
			t.Errorf("%s: %v after %v (%v), want requeued after %v to %v with the handler's error", e.Message.Key, e.Type, e.Delay, e.Err, delay/2, delay)
		}
	}
	if len(db.committed()) != 0 || db.claimed("a") {
		t.Fatal("the failed batch left effects or claims")
	}
}

func TestNewBatchConsumerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	h := func(context.Context, *sql.Tx, []*amqp.Delivery) error { return nil }
	for _, tc := range []struct {
		name string
		h    rabbitmq.BatchHandler
		opts []rabbitmq.Option
		want string
	}{
		{"nil handler", nil, nil, "nil handler"},
		{"zero batch size", h, []rabbitmq.Option{rabbitmq.WithBatchSize(0)}, "WithBatchSize"},
		{"batch too large", h, []rabbitmq.Option{rabbitmq.WithBatchSize(1001)}, "WithBatchSize"},
		{"prefetch below the batch size", h, []rabbitmq.Option{rabbitmq.WithBatchSize(50), rabbitmq.WithPrefetch(20)}, "batch size 50"},
		{"delivery context", h, []rabbitmq.Option{rabbitmq.WithDeliveryContext(func(ctx context.Context, _ *amqp.Delivery) context.Context { return ctx })}, "WithDeliveryContext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rabbitmq.NewBatchConsumer(mw, tc.h, tc.opts...)
			if err == nil || c != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewBatchConsumer: (%v, %v), want an error mentioning %q", c, err, tc.want)
			}
		})
	}
	c, err := rabbitmq.NewBatchConsumer(mw, h, rabbitmq.WithWorkers(2))
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeChannel()
	stop, _ := start(t, c, f)
	waitFor(t, "the consumer", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.tag != "" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if f.prefetch != 2*2*rabbitmq.DefaultBatchSize {
		t.Fatalf("prefetch %d, want twice the workers times the batch size", f.prefetch)
	}
}
