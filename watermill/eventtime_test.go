package watermill_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idwm "github.com/txclaim/idempotent/watermill"
)

// partitionedLedger is newLedger on a claim table partitioned by event day,
// its Middleware on a clock the test moves.
func partitionedLedger(t testing.TB, now time.Time) (*ledger, *testenv.Clock) {
	t.Helper()
	c := testenv.NewClock(now)
	return newLedger(t, testenv.OpenPostgres(t, 4), "loyalty", idempotent.WithDailyPartitions(2), idempotent.WithClock(c.Now)), c
}

// eventMessage is orderMessage with the producer's event time in the
// adapter.EventTimeHeader metadata field.
func eventMessage(t testing.TB, o order, at time.Time) *message.Message {
	t.Helper()
	m := orderMessage(t, o)
	m.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(at))
	return m
}

// verdicts is a router middleware, between the poison queue and the
// handler, that records what the handler returned for each key: how many
// times poison, and the delay of its last requeue.
type verdicts struct {
	mu      sync.Mutex
	poison  map[string]int
	requeue map[string]time.Duration
}

func newVerdicts() *verdicts {
	return &verdicts{poison: map[string]int{}, requeue: map[string]time.Duration{}}
}

func (v *verdicts) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		key := msg.UUID
		v.mu.Lock()
		defer v.mu.Unlock()
		var re *idwm.RequeueError
		switch {
		case adapter.IsPoison(err):
			v.poison[key]++
		case errors.As(err, &re):
			v.requeue[key] = re.Delay
		}
		return out, err
	}
}

func (v *verdicts) of(key string) (poisoned int, delay time.Duration, requeued bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delay, requeued = v.requeue[key]
	return v.poison[key], delay, requeued
}

// poisonRouter runs the ledger's handler with a poison queue outside it,
// filtered by adapter.IsPoison, and verdicts between them; it returns the
// settlement counts, the verdicts, the Pub/Sub and the poison topic.
func poisonRouter(t testing.TB, l *ledger, opts ...idwm.Option) (*settled, *verdicts, *gochannel.GoChannel, <-chan *message.Message) {
	t.Helper()
	pubsub := newGoChannel(t)
	poisonQ, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", adapter.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	poisoned, err := pubsub.Subscribe(context.Background(), "orders.poison")
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t)
	s, v := &settled{}, newVerdicts()
	r.AddMiddleware(s.middleware, poisonQ, v.middleware)
	r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, l.handler(nil), opts...))
	runRouter(t, r)
	return s, v, pubsub, poisoned
}

// poisonedMessage waits for the next message on the poison topic.
func poisonedMessage(t testing.TB, poisoned <-chan *message.Message, what string) *message.Message {
	t.Helper()
	select {
	case m := <-poisoned:
		m.Ack()
		return m
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing on the poison topic", what)
		return nil
	}
}

// TestPartitionedResendAcrossMidnightIsDuplicate: order 9912 is produced
// at 23:30 the day before and re-sent at 00:30 (a new publish time a
// Pub/Sub would stamp), both with the producer's event time in the header. Both claims go to the event day's partition: one Applied, one
// Duplicate, one effect, no nack.
func TestPartitionedResendAcrossMidnightIsDuplicate(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 15, 0, 30, 0, 0, time.UTC)
	l, _ := partitionedLedger(t, now)
	pubsub := newGoChannel(t)
	r := newRouter(t)
	var s settled
	r.AddMiddleware(s.middleware)
	r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, l.handler(nil)))
	runRouter(t, r)

	o := order{OrderID: 9912, CustomerID: 7, Points: 50}
	produced := now.Add(-time.Hour)
	first, resent := eventMessage(t, o, produced), eventMessage(t, o, produced)
	first.Metadata.Set("published_at", adapter.FormatEventTime(produced))
	resent.Metadata.Set("published_at", adapter.FormatEventTime(now))
	if err := pubsub.Publish("orders", first, resent); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both settled, or a nack", func() (bool, error) {
		return s.acked.Load() == 2 || s.nacked.Load() > 0, nil
	})
	t.Logf("acked %d, nacked %d, applied %d, duplicates %d", s.acked.Load(), s.nacked.Load(), l.counts.Applied(), l.counts.Duplicates())
	if a, d, n := l.counts.Applied(), l.counts.Duplicates(), s.nacked.Load(); a != 1 || d != 1 || n != 0 {
		t.Fatalf("applied %d, duplicates %d, nacks %d: want 1, 1, 0", a, d, n)
	}
	l.audit(t, []order{o})
}

// TestPartitionedWithoutEventTimeIsRefusedAtConstruction: a Middleware on
// a partitioned table needs a producer's event time; NewHandler refuses
// WithoutEventTime instead of failing every message later, and accepts the
// default (the header) and a function.
func TestPartitionedWithoutEventTimeIsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	l, _ := partitionedLedger(t, time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC))
	h := l.handler(nil)
	if _, err := idwm.NewHandler(l.mw, h, idwm.WithoutEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
		t.Fatalf("NewHandler(partitioned, WithoutEventTime()): %v, want ErrNoProducerEventTime", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if _, err := idwm.NewHandler(l.mw, h); err != nil {
		t.Fatalf("NewHandler(partitioned) with the default header: %v", err)
	}
	if _, err := idwm.NewHandler(l.mw, h, idwm.WithEventTime(idwm.TimeHeader("occurred_at"))); err != nil {
		t.Fatalf("NewHandler(partitioned, WithEventTime): %v", err)
	}
	if _, err := idwm.NewHandler(l.mw, h, idwm.WithEventTime(nil)); err == nil {
		t.Fatal("WithEventTime(nil) accepted")
	}
}

// TestFutureDatedRequeuedUntilTheClockCatchesUpOrPoison: behind GoChannel,
// where other messages pass a nacked one, with WithFutureBound(
// adapter.DefaultFutureBound): a message dated 30 minutes ahead of the
// clock (within the bound past the clock-skew margin) is nacked with a
// *RequeueError, nothing written, and applied once the clock has caught
// up; one dated 3 hours ahead goes to the poison topic exactly once,
// nothing written.
func TestFutureDatedRequeuedUntilTheClockCatchesUpOrPoison(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC)
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			c := testenv.NewClock(now)
			opts := []idempotent.Option{idempotent.WithClock(c.Now)}
			if partitioned {
				opts = append(opts, idempotent.WithDailyPartitions(2))
			}
			l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty", opts...)
			s, v, pubsub, poisoned := poisonRouter(t, l, idwm.WithFutureBound(adapter.DefaultFutureBound))

			far := order{OrderID: 1, CustomerID: 1, Points: 5}
			soon := order{OrderID: 2, CustomerID: 2, Points: 7}
			if err := pubsub.Publish("orders", eventMessage(t, far, now.Add(3*time.Hour))); err != nil {
				t.Fatal(err)
			}
			m := poisonedMessage(t, poisoned, "3h ahead")
			t.Logf("3h ahead: poisoned (%s)", m.Metadata.Get(middleware.ReasonForPoisonedKey))
			if err := pubsub.Publish("orders", eventMessage(t, soon, now.Add(30*time.Minute))); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the 30-minutes-ahead message requeued, or settled", func() (bool, error) {
				_, _, requeued := v.of(soon.Key())
				return requeued || s.acked.Load() > 1, nil
			})
			_, d, _ := v.of(soon.Key())
			t.Logf("30m ahead: requeued with delay %v; applied so far %d", d, l.counts.Applied())
			if l.counts.Applied() != 0 || d != 25*time.Minute {
				t.Fatalf("30m ahead: applied %d, requeue delay %v; want 0 and 25m (30m less the 5m clock-skew margin)", l.counts.Applied(), d)
			}
			c.Add(30 * time.Minute)
			waitFor(t, 30*time.Second, "the future-dated message applied once the clock caught up", func() (bool, error) { return s.acked.Load() == 2, nil })
			if p, _, _ := v.of(far.Key()); p != 1 || l.counts.Applied() != 1 {
				t.Fatalf("3h ahead poisoned %d times, %d applied: want 1 and 1", p, l.counts.Applied())
			}
			if p, _, _ := v.of(soon.Key()); p != 0 {
				t.Fatalf("30m ahead poisoned %d times, want 0", p)
			}
			l.audit(t, []order{soon})
		})
	}
}

// TestBadEventTimeHeaderIsPoison: a header that is not RFC 3339 (seconds
// read as a number, say) is poison: the poison topic gets it once, nothing
// is written, and the message behind it is applied.
func TestBadEventTimeHeaderIsPoison(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	s, v, pubsub, poisoned := poisonRouter(t, l)
	bad := orderMessage(t, order{OrderID: 1, CustomerID: 1, Points: 5})
	bad.Metadata.Set(adapter.EventTimeHeader, "1773576000")
	good := order{OrderID: 2, CustomerID: 2, Points: 7}
	if err := pubsub.Publish("orders", bad, eventMessage(t, good, time.Now().Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}
	m := poisonedMessage(t, poisoned, "bad header")
	waitFor(t, 30*time.Second, "both acked", func() (bool, error) { return s.acked.Load() == 2, nil })
	t.Logf("poisoned: %s", m.Metadata.Get(middleware.ReasonForPoisonedKey))
	if p, _, _ := v.of(bad.UUID); m.UUID != bad.UUID || p != 1 {
		t.Fatalf("poison topic got %s, the bad message was poisoned %d times; want %s once", m.UUID, p, bad.UUID)
	}
	l.audit(t, []order{good})
}
