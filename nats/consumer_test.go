package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/postgres"
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

	// The first process commits the credit, then its connection dies
	// before the ack leaves.
	var got events
	first := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithObserver(&got)))
	pnc := connect(t, nc.ConnectedUrl())
	crashing := hookedConsumer{Consumer: bindConsumer(t, newJS(t, pnc), stream, durable), doubleAck: func(ctx context.Context, m jetstream.Msg) error {
		pnc.Close()
		return m.DoubleAck(ctx)
	}}
	if err := first.Run(context.Background(), crashing); !errors.Is(err, idnats.ErrConnectionClosed) {
		t.Fatalf("first Run: %v, want ErrConnectionClosed", err)
	}
	if s := first.Stats(); s.Applied != 1 || s.SettleFailed != 1 {
		t.Fatalf("first consumer: %+v, want 1 applied whose ack failed", s)
	}
	if f := got.of(adapter.EventSettleFailed); len(f) != 1 || f[0].Message.Key != o.Key() || f[0].Err == nil {
		t.Fatalf("settle failures %+v, want the ack of %s", f, o.Key())
	}

	// The server redelivers after AckWait to the next process, which
	// finds the claim.
	second := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithObserver(&got)))
	r := start(t, second, nc.ConnectedUrl(), stream, durable)
	waitFor(t, 30*time.Second, "the redelivery's ack", func() (bool, error) { return second.Stats().Duplicates == 1, nil })
	if err := r.stop(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if s := second.Stats(); s.SettleFailed != 0 || s.Applied != 0 {
		t.Fatalf("second consumer: %+v, want 1 duplicate acked", s)
	}
	var seen []string
	for _, ev := range got.all {
		if ev.Type == adapter.EventApplied || ev.Type == adapter.EventDuplicate {
			seen = append(seen, fmt.Sprintf("%v@%d", ev.Type, ev.Attempt))
		}
	}
	if fmt.Sprint(seen) != "[applied@1 duplicate@2]" {
		t.Fatalf("deliveries (outcome@attempt) %v, want [applied@1 duplicate@2]", seen)
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

	var got events
	c := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithEventTime(idnats.TimeHeader("Event-Time")), idnats.WithObserver(&got)))
	runUntil(t, c, cons, "all five settled", func(s adapter.Stats) bool { return settledAll(s) == 5 })
	if s := c.Stats(); s.Applied != 1 || s.DeadLettered != 4 || s.Requeued != 0 {
		t.Fatalf("stats %+v, want 1 applied, 4 terminated, nothing naked", s)
	}
	terminated := map[uint64]error{} // stream sequence -> error
	for _, ev := range got.of(adapter.EventDeadLettered) {
		terminated[seq(ev)] = ev.Err
	}
	for sq, want := range map[uint64]error{1: adapter.ErrNoKey, 2: adapter.ErrUndecodable, 4: idempotent.ErrBeyondRetention, 5: adapter.ErrNoEventTime} {
		if err := terminated[sq]; !errors.Is(err, want) {
			t.Errorf("message %d terminated with %v, want %v", sq, err, want)
		}
	}
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
	h := idnats.Decode(idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ jetstream.Msg) error {
		if err := l.credit(ctx, tx, o); err != nil {
			return err
		}
		if attempts.Add(1) <= 3 {
			return errors.New("pricing service timed out")
		}
		return nil
	})
	var got events
	c := must(t)(idnats.NewConsumer(l.mw, h, idnats.WithRetryDelay(10*time.Millisecond, 25*time.Millisecond), idnats.WithObserver(&got)))
	runUntil(t, c, cons, "the ack", func(s adapter.Stats) bool { return s.Applied == 1 })
	if s := c.Stats(); s.Requeued != 3 || s.Applied != 1 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v, want 3 naks then 1 applied", s)
	}
	// RetryPolicy.Backoff of the delivery count: 10ms, 20ms, 25ms
	// (doubling, bounded), each drawn from the upper half of its value.
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond}
	naked := got.of(adapter.EventRequeued)
	if len(naked) != len(want) {
		t.Fatalf("naks %v, want 3 of them", naked)
	}
	for i, ev := range naked {
		if ev.Delay < want[i]/2 || ev.Delay > want[i] || ev.Attempt != i+1 {
			t.Errorf("nak %d: attempt %d, delay %v; want attempt %d, %v to %v (doubling, bounded, jittered)", i+1, ev.Attempt, ev.Delay, i+1, want[i]/2, want[i])
		}
	}
	if a := got.of(adapter.EventApplied); len(a) != 1 || a[0].Attempt != 4 {
		t.Errorf("applied %+v, want once, on the fourth delivery", a)
	}
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
	var beats atomic.Int32
	counting := hookedConsumer{Consumer: cons, inProgress: func(m jetstream.Msg) error {
		err := m.InProgress()
		if err == nil {
			beats.Add(1)
		}
		return err
	}}
	giveUp := make(chan struct{})
	t.Cleanup(func() { close(giveUp) })
	h := idnats.Decode(idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ jetstream.Msg) error {
		for beats.Load() < 3 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-giveUp:
				return errors.New("the test gave up")
			case <-time.After(10 * time.Millisecond):
			}
		}
		return l.credit(ctx, tx, o)
	})
	c := must(t)(idnats.NewConsumer(l.mw, h, idnats.WithWorkers(2), idnats.WithFetchWait(100*time.Millisecond)))
	runUntil(t, c, counting, "the ack", func(s adapter.Stats) bool { return s.Applied == 1 })
	if s := c.Stats(); s.Applied != 1 || s.Duplicates+s.Requeued+s.SettleFailed != 0 || beats.Load() < 3 {
		t.Fatalf("stats %+v, %d InProgress; want 1 delivery, applied, with 3 or more InProgress", s, beats.Load())
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
	first := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithWorkers(4), idnats.WithFetchWait(50*time.Millisecond)))
	p := start(t, first, nc.ConnectedUrl(), stream, durable)
	waitFor(t, 30*time.Second, "100 acks", func() (bool, error) { return first.Stats().Applied >= 100, nil })
	if err := p.stop(); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	s1 := first.Stats()
	if s1.SettleFailed != 0 || s1.Requeued != 0 || s1.Duplicates != 0 || s1.Applied >= int64(len(orders)) {
		t.Fatalf("first consumer %+v: every message it applied must be acked when Run returns, and some left", s1)
	}
	second := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithWorkers(4), idnats.WithFetchWait(50*time.Millisecond)))
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
	logFetch := adapter.ObserverFunc(func(_ context.Context, ev adapter.Event) {
		if ev.Type == adapter.EventFetchError {
			t.Logf("fetch error: %v", ev.Err)
		}
	})
	c := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithWorkers(2), idnats.WithFetchWait(50*time.Millisecond), idnats.WithObserver(logFetch)))
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
	bad := order{OrderID: 1000, CustomerID: 0, Points: 1}
	for i, o := range orders {
		publish(t, js, stream+".orders", o.Key(), mustJSON(t, o), nil)
		if i == 150 {
			// Amid the batch: a message whose order names no customer,
			// which the handler names poison, and one without a key, set
			// aside before the transaction.
			publish(t, js, stream+".orders", bad.Key(), mustJSON(t, bad), nil)
			publish(t, js, stream+".orders", "", []byte(`{}`), nil)
		}
	}

	var runs atomic.Int32
	h := func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error {
		runs.Add(1)
		batch, err := decodeOrders(msgs)
		if err != nil {
			return err
		}
		for i, o := range batch {
			if o.CustomerID == 0 {
				return adapter.PoisonItem(i, fmt.Errorf("order %d names no customer", o.OrderID))
			}
		}
		return l.creditBatch(ctx, tx, batch)
	}
	var got events
	c := must(t)(idnats.NewBatchConsumer(l.mw, h, idnats.WithBatchSize(100), idnats.WithWorkers(2), idnats.WithFetchWait(50*time.Millisecond), idnats.WithObserver(&got)))
	runUntil(t, c, cons, "all settled", func(s adapter.Stats) bool { return settledAll(s) == int64(len(orders))+2 })
	if s := c.Stats(); s.Applied != int64(len(orders)) || s.DeadLettered != 2 || s.Requeued != 0 {
		t.Fatalf("stats %+v, want %d applied and 2 terminated", s, len(orders))
	}
	dead := got.of(adapter.EventDeadLettered)
	var named, keyless bool
	for _, ev := range dead {
		named = named || (ev.Message.Key == bad.Key() && adapter.IsPoison(ev.Err))
		keyless = keyless || (ev.Message.Key == "" && errors.Is(ev.Err, adapter.ErrNoKey))
	}
	if !named || !keyless {
		t.Fatalf("terminated %+v, want %s (named by the handler) and the message without a key", dead, bad.Key())
	}
	// Three fetches of at most 100 at least, and the one with the bad
	// order ran again without it.
	if r := runs.Load(); r < 4 {
		t.Errorf("the handler ran %d times, want at least 4", r)
	}
	l.audit(t, orders)
}

// TestConstructorsRefuseBadOptions needs no server: the constructors send
// nothing.
func TestConstructorsRefuseBadOptions(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", "postgres://127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{db: db, mw: mw}
	batch := func(context.Context, *sql.Tx, []jetstream.Msg) error { return nil }
	for name, err := range map[string]error{
		"nil Middleware": func() error { _, err := idnats.NewConsumer(nil, l.handler()); return err }(),
		"nil handler":    func() error { _, err := idnats.NewConsumer(l.mw, nil); return err }(),
		"nil batch":      func() error { _, err := idnats.NewBatchConsumer(l.mw, nil); return err }(),
		"nil option":     func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), nil); return err }(),
		"batch size per message": func() error {
			_, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithBatchSize(10))
			return err
		}(),
		"fetch size in batches": func() error {
			_, err := idnats.NewBatchConsumer(l.mw, batch, idnats.WithFetchSize(10))
			return err
		}(),
		"batch too large": func() error {
			_, err := idnats.NewBatchConsumer(l.mw, batch, idnats.WithBatchSize(idnats.MaxFetch+1))
			return err
		}(),
		"zero workers":   func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithWorkers(0)); return err }(),
		"nil key":        func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithKey(nil)); return err }(),
		"nil event time": func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithEventTime(nil)); return err }(),
		"nil observer":   func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithObserver(nil)); return err }(),
		"retry delay": func() error {
			_, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithRetryDelay(time.Second, time.Millisecond))
			return err
		}(),
		"fetch wait": func() error { _, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithFetchWait(0)); return err }(),
		"shutdown timeout": func() error {
			_, err := idnats.NewConsumer(l.mw, l.handler(), idnats.WithShutdownTimeout(0))
			return err
		}(),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := idnats.NewBatchConsumer(l.mw, batch, idnats.WithBatchSize(idnats.MaxFetch)); err != nil {
		t.Errorf("batch of MaxFetch: %v", err)
	}
}
