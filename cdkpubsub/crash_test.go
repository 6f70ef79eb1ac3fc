package cdkpubsub_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
)

// A consumer that dies after its transaction committed, before its ack
// reached the service, leaves the message to come again at the ack
// deadline: the next process finds the claim, and the delivery is a
// Duplicate with no second effect.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	b := newMemBroker(t, 300*time.Millisecond)
	rec := testenv.NewRecorder()
	c, err := cdkpubsub.NewConsumer(l.mw, l.handler(), cdkpubsub.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	o := order{OrderID: 7, CustomerID: 3, Points: 40}
	sendOrder(t, b, o, time.Now())

	first := start(c, b, &memProc{crashAt: func(key string) bool { return key == o.Key() }})
	rec.Until(t, 10*time.Second, "dead at its ack", first.proc.dead)
	if n := rec.Count(adapter.EventApplied, o.Key()); n != 1 {
		t.Fatalf("%d Applied before the crash, want 1", n)
	}
	first.stop(t)

	second := start(c, b, &memProc{})
	rec.Until(t, 10*time.Second, "delivered again as a Duplicate", func() bool { return rec.Count(adapter.EventDuplicate, o.Key()) == 1 })
	second.stop(t)
	if n := rec.Count(adapter.EventApplied, o.Key()); n != 1 {
		t.Errorf("%d Applied, want 1", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// A handler that runs past the ack deadline gets its message delivered
// again while it runs. The second delivery waits on the claim the first
// holds (or, once the first committed, finds it): it is a Duplicate, or
// requeued and then a Duplicate; the effect is applied once.
func TestAckDeadlineExpiresMidHandler(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	b := newMemBroker(t, 200*time.Millisecond)
	rec := testenv.NewRecorder()
	o := order{OrderID: 11, CustomerID: 5, Points: 9}
	var received atomic.Int32
	again := make(chan struct{})
	var once sync.Once
	var runs atomic.Int32
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if runs.Add(1) == 1 {
			// Hold the claim until the service has delivered the message
			// again, its ack deadline passed.
			select {
			case <-again:
			case <-time.After(10 * time.Second):
				t.Error("the message was not delivered again while its handler ran")
			}
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithObserver(rec), cdkpubsub.WithWorkers(2), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sendOrder(t, b, o, time.Now())
	pr := start(c, b, &memProc{onReceive: func(string) {
		if received.Add(1) == 2 {
			once.Do(func() { close(again) })
		}
	}})
	rec.Until(t, 10*time.Second, "applied, and a later delivery a Duplicate", func() bool {
		return rec.Count(adapter.EventApplied, o.Key()) == 1 && rec.Count(adapter.EventDuplicate, o.Key()) >= 1
	})
	pr.stop(t)
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1: a second delivery ran it while the first held the claim", n)
	}
	if n := rec.Count(adapter.EventApplied, o.Key()); n != 1 {
		t.Errorf("%d Applied, want 1", n)
	}
	t.Logf("%d deliveries: 1 applied, %d duplicates, %d requeued", received.Load(),
		rec.Count(adapter.EventDuplicate, o.Key()), rec.Count(adapter.EventRequeued, o.Key()))
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// 3,000 orders, 30% of them sent twice, through consumers killed three
// times mid-stream: every order is applied exactly once, and the balances
// are exact.
func TestLoadWithDuplicatesAndKills(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "per-message"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			b := newMemBroker(t, 500*time.Millisecond)
			rec := testenv.NewRecorder()
			opts := []cdkpubsub.Option{cdkpubsub.WithObserver(rec), cdkpubsub.WithWorkers(4), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
			var c *cdkpubsub.Consumer
			var err error
			if batch {
				c, err = cdkpubsub.NewBatchConsumer(l.mw, l.batchHandler(), append(opts, cdkpubsub.WithBatchSize(50))...)
			} else {
				c, err = cdkpubsub.NewConsumer(l.mw, l.handler(), opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			orders := testenv.MakeOrders(3000)
			at := time.Now()
			sends := 0
			for _, o := range orders {
				sendOrder(t, b, o, at)
				sends++
				if o.OrderID%10 < 3 {
					sendOrder(t, b, o, at) // a producer's re-send
					sends++
				}
			}
			var killed []*process
			for round := 1; round <= 3; round++ {
				pr := start(c, b, &memProc{})
				rec.Until(t, 30*time.Second, "applied enough to kill", func() bool { return rec.Sum(adapter.EventApplied) >= round*600 })
				pr.kill()
				killed = append(killed, pr)
			}
			last := start(c, b, &memProc{})
			rec.Until(t, 60*time.Second, "applied every order", func() bool { return rec.Sum(adapter.EventApplied) >= len(orders) })
			last.stop(t)
			for _, pr := range killed {
				pr.wait(t)
			}
			if n := rec.Sum(adapter.EventApplied); n != len(orders) {
				t.Errorf("%d Applied, want %d", n, len(orders))
			}
			if n := rec.Sum(adapter.EventDeadLettered); n != 0 {
				t.Errorf("%d dead-lettered, want 0", n)
			}
			s := c.Stats()
			t.Logf("%d sends of %d orders: applied %d, duplicates %d, requeued %d, released %d", sends, len(orders),
				s.Applied, s.Duplicates, s.Requeued, s.Released)
			testenv.AuditOrders(t, l.db, l.schema, orders)
		})
	}
}
