package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
)

func TestCrashAfterCommitBeforeAckIsRedeliveredAsDuplicate(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	newConsumer(t, s, durable, time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	o := order{OrderID: 9912, CustomerID: 7, Points: 50}
	publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)

	type seen struct {
		outcome   idempotent.Outcome
		delivered uint64
	}
	var mu sync.Mutex
	var got []seen
	record := func(after func()) idnats.Handler {
		h := l.handler(t)
		return func(ctx context.Context, m jetstream.Msg) (idempotent.Outcome, error) {
			out, err := h(ctx, m)
			if err != nil {
				t.Errorf("handler: %v", err)
			}
			md, _ := m.Metadata()
			mu.Lock()
			got = append(got, seen{out, md.NumDelivered})
			mu.Unlock()
			after()
			return out, err
		}
	}

	// The first process commits the credit, then its connection dies
	// before the ack leaves.
	first, err := idnats.NewConsumer(nil, idnats.WithWorkers(1))
	if first != nil || err == nil {
		t.Fatal("NewConsumer(nil) did not fail")
	}
	pnc := connect(t, nc.ConnectedUrl())
	first, err = idnats.NewConsumer(record(pnc.Close), idnats.WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Run(context.Background(), bindConsumer(t, newJS(t, pnc), stream, durable)); !errors.Is(err, idnats.ErrConnectionClosed) {
		t.Fatalf("first Run: %v, want ErrConnectionClosed", err)
	}
	if s := first.Stats(); s.Applied != 1 || s.Acked != 0 || s.SettleFailed != 1 {
		t.Fatalf("first consumer: %+v, want 1 applied whose ack failed", s)
	}

	// The server redelivers after AckWait to the next process, which
	// finds the claim.
	second, err := idnats.NewConsumer(record(func() {}), idnats.WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, second, nc.ConnectedUrl(), stream, durable)
	waitFor(t, 30*time.Second, "the redelivery's ack", func() (bool, error) { return second.Stats().Acked == 1, nil })
	if err := r.stop(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	want := []seen{{idempotent.Applied, 1}, {idempotent.Duplicate, 2}}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("deliveries (outcome, delivery count) %v, want %v", got, want)
	}
	l.audit(t, []order{o})
	cons := bindConsumer(t, js, stream, durable)
	if np, ap, err := pending(t, cons); err != nil || np != 0 || ap != 0 {
		t.Fatalf("consumer pending %d, ack pending %d (%v), want 0 and 0", np, ap, err)
	}
}

func TestPoisonIsTerminatedAndReported(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, 30*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	good := order{OrderID: 1, CustomerID: 3, Points: 12}
	now := map[string]string{"Event-Time": time.Now().UTC().Format(time.RFC3339)}
	old := order{OrderID: 4, CustomerID: 3, Points: 7}
	publish(t, js, stream+".orders", "", mustJSON(t, order{OrderID: 2, CustomerID: 3, Points: 9}), now) // no Nats-Msg-Id
	publish(t, js, stream+".orders", "order-completed:3", []byte("order 3, customer 3, 9 points"), now)
	publish(t, js, stream+".orders", good.Key(), mustJSON(t, good), now)
	publish(t, js, stream+".orders", old.Key(), mustJSON(t, old), map[string]string{"Event-Time": time.Now().Add(-40 * 24 * time.Hour).UTC().Format(time.RFC3339)})
	publish(t, js, stream+".orders", "order-completed:5", mustJSON(t, order{OrderID: 5, CustomerID: 3, Points: 1}), nil) // no event time

	var mu sync.Mutex
	terminated := map[uint64]error{} // stream sequence -> error
	h := must[idnats.Handler](t)(idnats.Decode(l.mw, idnats.MsgID(), idnats.JSON[order], l.credit, idnats.WithEventTime(idnats.TimeHeader("Event-Time"))))
	c, err := idnats.NewConsumer(h, idnats.WithOnSettle(func(_ context.Context, s idnats.Settlement) {
		if s.Action == idnats.Terminated {
			md, _ := s.Msg.Metadata()
			mu.Lock()
			terminated[md.Sequence.Stream] = s.Err
			mu.Unlock()
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cons) }()
	waitFor(t, 30*time.Second, "all five settled", func() (bool, error) {
		s := c.Stats()
		return s.Acked+s.Terminated == 5, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Acked != 1 || s.Terminated != 4 || s.Naked != 0 || s.Delivered != 5 {
		t.Fatalf("stats %+v, want 1 acked, 4 terminated, nothing naked", s)
	}
	mu.Lock()
	for seq, want := range map[uint64]error{1: idnats.ErrNoKey, 2: idnats.ErrUndecodable, 4: idempotent.ErrBeyondRetention, 5: idempotent.ErrInvalidEventTime} {
		if err := terminated[seq]; !errors.Is(err, want) {
			t.Errorf("message %d terminated with %v, want %v", seq, err, want)
		}
	}
	mu.Unlock()
	// Terminated messages are not redelivered, and nothing of them was
	// written.
	if np, ap, err := pending(t, cons); err != nil || np != 0 || ap != 0 {
		t.Fatalf("consumer pending %d, ack pending %d (%v), want 0 and 0", np, ap, err)
	}
	l.audit(t, []order{good})
}

func TestFailedMessageIsNakedWithBoundedDelayThenApplied(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, 30*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	o := order{OrderID: 77, CustomerID: 9, Points: 42}
	publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)

	// The first three attempts fail inside the transaction: the claim rolls
	// back with the effect.
	var attempts atomic.Int32
	h := must[idnats.Handler](t)(idnats.Decode(l.mw, nil, idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, o order) error {
		if err := l.credit(ctx, tx, o); err != nil {
			return err
		}
		if attempts.Add(1) <= 3 {
			return errors.New("pricing service timed out")
		}
		return nil
	}))
	var mu sync.Mutex
	var delays []time.Duration
	c, err := idnats.NewConsumer(h, idnats.WithWorkers(1), idnats.WithNakDelay(10*time.Millisecond, 25*time.Millisecond),
		idnats.WithOnSettle(func(_ context.Context, s idnats.Settlement) {
			if s.Action == idnats.Naked {
				mu.Lock()
				delays = append(delays, s.Delay)
				mu.Unlock()
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cons) }()
	waitFor(t, 30*time.Second, "the ack", func() (bool, error) { return c.Stats().Acked == 1, nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Naked != 3 || s.Applied != 1 || s.Terminated != 0 {
		t.Fatalf("stats %+v, want 3 naks then 1 applied", s)
	}
	mu.Lock()
	// RetryPolicy.Backoff: 10ms, 20ms, 25ms (doubling, bounded), each drawn
	// from the upper half of its value.
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond}
	if len(delays) != len(want) {
		t.Fatalf("nak delays %v, want 3 of them", delays)
	}
	for i, d := range delays {
		if d < want[i]/2 || d > want[i] {
			t.Errorf("nak delay %d is %v, want %v to %v (doubling, bounded, jittered): %v", i+1, d, want[i]/2, want[i], delays)
		}
	}
	mu.Unlock()
	l.audit(t, []order{o})
}

func TestLongHandlerSendsInProgressAndIsNotRedelivered(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	o := order{OrderID: 5, CustomerID: 5, Points: 5}
	publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)

	// The handler holds the message for three half-AckWaits: without the
	// heartbeats the server would redeliver it to the second worker.
	var c *idnats.Consumer
	giveUp := make(chan struct{})
	t.Cleanup(func() { close(giveUp) })
	h := must[idnats.Handler](t)(idnats.Decode(l.mw, nil, idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, o order) error {
		for c.Stats().InProgress < 3 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-giveUp:
				return errors.New("the test gave up")
			case <-time.After(10 * time.Millisecond):
			}
		}
		return l.credit(ctx, tx, o)
	}))
	var err error
	c, err = idnats.NewConsumer(h, idnats.WithWorkers(2), idnats.WithFetchWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cons) }()
	waitFor(t, 30*time.Second, "the ack", func() (bool, error) { return c.Stats().Acked == 1, nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Delivered != 1 || s.Applied != 1 || s.InProgress < 3 {
		t.Fatalf("stats %+v, want 1 delivery, applied, with 3 or more InProgress", s)
	}
	l.audit(t, []order{o})
}

func TestShutdownFinishesInFlightAndLosesNothing(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	newConsumer(t, s, durable, 30*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 8), durable)
	orders := testenv.MakeOrders(400)
	for _, o := range orders {
		publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)
	}
	first, err := idnats.NewConsumer(l.handler(t), idnats.WithWorkers(4), idnats.WithFetchWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, first, nc.ConnectedUrl(), stream, durable)
	waitFor(t, 30*time.Second, "100 acks", func() (bool, error) { return first.Stats().Acked >= 100, nil })
	if err := p.stop(); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	s1 := first.Stats()
	if s1.Applied != s1.Acked || s1.SettleFailed != 0 || s1.Naked != 0 || s1.Applied >= int64(len(orders)) {
		t.Fatalf("first consumer %+v: every message it applied must be acked when Run returns, and some left", s1)
	}
	second, err := idnats.NewConsumer(l.handler(t), idnats.WithWorkers(4), idnats.WithFetchWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, second, nc.ConnectedUrl(), stream, durable)
	cons := bindConsumer(t, js, stream, durable)
	waitFor(t, 60*time.Second, "the rest", func() (bool, error) {
		np, ap, err := pending(t, cons)
		return err == nil && np == 0 && ap == 0, nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	s2 := second.Stats()
	if s1.Applied+s2.Applied != int64(len(orders)) || s2.Duplicates != 0 {
		t.Fatalf("applied %d + %d (duplicates %d), want %d in all and no duplicate: a graceful shutdown acks what it applied",
			s1.Applied, s2.Applied, s2.Duplicates, len(orders))
	}
	l.audit(t, orders)
}

func TestRunReportsConsumerGoneAndRefusesAckNone(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	l := newLedger(t, testenv.OpenPostgres(t, 2), "loyalty")
	c, err := idnats.NewConsumer(l.handler(t), idnats.WithWorkers(2), idnats.WithFetchWait(50*time.Millisecond), idnats.WithOnFetchError(func(err error) { t.Logf("fetch error: %v", err) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ackNone, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "fast", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx, ackNone); !errors.Is(err, idnats.ErrNotDurable) {
		t.Fatalf("Run on an AckNone consumer: %v, want ErrNotDurable", err)
	}
	runDeleted := func(name string, beforeRun bool) {
		t.Helper()
		cons := newConsumer(t, s, name, 30*time.Second)
		if beforeRun {
			// Pull requests to it expire unanswered.
			if err := js.DeleteConsumer(ctx, stream, name); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx, cons) }()
		if !beforeRun {
			// The server answers open pull requests "consumer deleted".
			waitFor(t, 10*time.Second, "open pull requests", func() (bool, error) {
				info, err := cons.Info(ctx)
				return err == nil && info.NumWaiting >= 1, nil
			})
			if err := js.DeleteConsumer(ctx, stream, name); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-done:
			if !errors.Is(err, idnats.ErrConsumerGone) {
				t.Fatalf("%s: Run after the consumer was deleted: %v, want ErrConsumerGone", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Run did not return after the consumer was deleted", name)
		}
	}
	runDeleted("deleted-while-pulling", false)
	runDeleted("deleted-before-run", true)
}

func TestBatchConsumerAppliesOnceAndSetsPoisonAside(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, 30*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	orders := testenv.MakeOrders(300)
	for i, o := range orders {
		publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)
		if i == 150 {
			// Amid the batch: a message whose order names no customer, which
			// the handler marks poison, failing its batch, which is then
			// tried message by message; and one without a key.
			bad := order{OrderID: 1000, CustomerID: 0, Points: 1}
			publish(t, js, stream+".orders", bad.Key(), mustJSON(t, bad), nil)
			publish(t, js, stream+".orders", "", []byte(`{}`), nil)
		}
	}

	h := must[idnats.BatchHandler](t)(idnats.DecodeBatch(l.mw, nil, idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, batch []order) error {
		for _, o := range batch {
			if o.CustomerID == 0 {
				return idnats.Poison(fmt.Errorf("order %d names no customer", o.OrderID))
			}
		}
		return l.creditBatch(ctx, tx, batch)
	}))
	c, err := idnats.NewBatchConsumer(100, h, idnats.WithWorkers(2), idnats.WithFetchWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cons) }()
	waitFor(t, 30*time.Second, "all settled", func() (bool, error) {
		s := c.Stats()
		return s.Acked+s.Terminated == int64(len(orders))+2, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Applied != int64(len(orders)) || s.Terminated != 2 || s.Naked != 0 {
		t.Fatalf("stats %+v, want %d applied and 2 terminated", s, len(orders))
	}
	l.audit(t, orders)
}
