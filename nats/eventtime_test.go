package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
)

// The tests of this file publish without Nats-Msg-Id (the key is in the
// Order-Key header), so that the stream keeps a re-send within its
// duplicate window: each publish is a new stream message with a new stream
// timestamp, as a re-send after the window is.

var orderKey = idnats.Header("Order-Key")

// modes are the two ways of consuming: a transaction per message, and
// batches (at most 10 messages).
var modes = []struct {
	name string
	new  func(l *ledger, hopts []idnats.HandlerOption, opts ...idnats.Option) (*idnats.Consumer, error)
}{
	{"per-message", func(l *ledger, hopts []idnats.HandlerOption, opts ...idnats.Option) (*idnats.Consumer, error) {
		h, err := idnats.Decode(l.mw, orderKey, idnats.JSON[order], l.credit, hopts...)
		if err != nil {
			return nil, err
		}
		return idnats.NewConsumer(h, opts...)
	}},
	{"batch", func(l *ledger, hopts []idnats.HandlerOption, opts ...idnats.Option) (*idnats.Consumer, error) {
		h, err := idnats.DecodeBatch(l.mw, orderKey, idnats.JSON[order], l.creditBatch, hopts...)
		if err != nil {
			return nil, err
		}
		return idnats.NewBatchConsumer(10, h, opts...)
	}},
}

// publishOrder publishes o keyed by the Order-Key header, with the event
// time header set to at (as FormatEventTime writes it) or to raw when at is
// zero and raw is not empty.
func publishOrder(t testing.TB, js jetstream.JetStream, subject string, o order, at time.Time, raw string) {
	t.Helper()
	hdr := map[string]string{"Order-Key": o.Key()}
	switch {
	case !at.IsZero():
		hdr[adapter.EventTimeHeader] = adapter.FormatEventTime(at)
	case raw != "":
		hdr[adapter.EventTimeHeader] = raw
	}
	publish(t, js, subject, "", mustJSON(t, o), hdr)
}

// settlements records what a Consumer told the server, in order.
type settlements struct {
	mu  sync.Mutex
	all []idnats.Settlement
}

func (s *settlements) add(_ context.Context, st idnats.Settlement) {
	s.mu.Lock()
	s.all = append(s.all, st)
	s.mu.Unlock()
}

func (s *settlements) list() []idnats.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idnats.Settlement(nil), s.all...)
}

// with returns the settlements of action a.
func (s *settlements) with(a idnats.Action) []idnats.Settlement {
	var out []idnats.Settlement
	for _, st := range s.list() {
		if st.Action == a {
			out = append(out, st)
		}
	}
	return out
}

// modeRun is what each mode's run of a test gets: a stream of its own, a
// durable "loyalty" on it, and a ledger on a schema of its own.
type modeRun struct {
	*ledger
	js      jetstream.JetStream
	subject string
	cons    jetstream.Consumer
	// consumer builds the mode's Consumer on the ledger.
	consumer func(hopts []idnats.HandlerOption, opts ...idnats.Option) (*idnats.Consumer, error)
}

// inEachMode runs f as a subtest for each of modes, with a ledger whose
// Middleware has idempotent's options opts.
func inEachMode(t *testing.T, opts []idempotent.Option, f func(t *testing.T, r modeRun)) {
	t.Helper()
	db := testenv.OpenPostgres(t, 4)
	js := newJS(t, localNATS(t))
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, stream := newStream(t, js, 1)
			r := modeRun{ledger: newLedger(t, db, "loyalty", opts...), js: js, subject: stream + ".orders", cons: newConsumer(t, s, "loyalty", 30*time.Second)}
			r.consumer = func(hopts []idnats.HandlerOption, opts ...idnats.Option) (*idnats.Consumer, error) {
				return m.new(r.ledger, hopts, opts...)
			}
			f(t, r)
		})
	}
}

// runUntil runs c on cons until done holds for its Stats, then shuts it
// down gracefully.
func runUntil(t *testing.T, c *idnats.Consumer, cons jetstream.Consumer, what string, done func(idnats.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx, cons) }()
	waitFor(t, 30*time.Second, what, func() (bool, error) {
		select {
		case err := <-ran:
			return false, errors.Join(errors.New("Run returned"), err)
		default:
		}
		return done(c.Stats()), nil
	})
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// TestResentMessageKeepsItsEventTimeHeaderAndIsDuplicateOnPartitionedTable
// is issue 21 cases 1 and 2: on a day-partitioned claim table, a handler
// built with no event-time option reads the producer's event time from the
// Idempotent-Event-Time header. The key is produced at now−24h and re-sent
// now: a new stream message with a new stream timestamp, but the same
// header, so both claims go to yesterday's partition: one Applied, one
// Duplicate, one effect — per message and in batches.
func TestResentMessageKeepsItsEventTimeHeaderAndIsDuplicateOnPartitionedTable(t *testing.T) {
	t.Parallel()
	inEachMode(t, []idempotent.Option{idempotent.WithDailyPartitions(1), idempotent.WithRetention(3 * 24 * time.Hour)}, func(t *testing.T, l modeRun) {
		o := order{OrderID: 9912, CustomerID: 7, Points: 15}
		produced := time.Now().Add(-24 * time.Hour)
		publishOrder(t, l.js, l.subject, o, produced, "")
		publishOrder(t, l.js, l.subject, o, produced, "") // the re-send

		var got settlements
		c, err := l.consumer(nil, idnats.WithWorkers(1), idnats.WithFetchWait(50*time.Millisecond), idnats.WithOnSettle(got.add))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s idnats.Stats) bool { return s.Acked+s.Terminated+s.Naked >= 2 })
		for _, st := range got.list() {
			if st.Err != nil {
				t.Errorf("%v: %v", st.Action, st.Err)
			}
		}
		if st := c.Stats(); st.Applied != 1 || st.Duplicates != 1 || st.Acked != 2 {
			t.Fatalf("stats %+v, want 1 applied and 1 duplicate, both acked", st)
		}
		l.audit(t, []order{o})
	})
}

// TestPartitionedTableWithoutEventTimeIsRefusedAtConstruction is issue 21
// case 2: a handler that reads no event time cannot claim on a
// day-partitioned table, so every constructor refuses it — never a
// terminated message later. The default (the header) and an explicit
// source are accepted.
func TestPartitionedTableWithoutEventTimeIsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 2)
	l := newLedger(t, db, "loyalty", idempotent.WithDailyPartitions(1), idempotent.WithRetention(2*24*time.Hour))
	plain := newLedger(t, db, "loyalty")
	build := map[string]func(l *ledger, opts ...idnats.HandlerOption) error{
		"Decode": func(l *ledger, opts ...idnats.HandlerOption) error {
			_, err := idnats.Decode(l.mw, nil, idnats.JSON[order], l.credit, opts...)
			return err
		},
		"Process": func(l *ledger, opts ...idnats.HandlerOption) error {
			_, err := idnats.Process(l.mw, nil, func(context.Context, *sql.Tx, jetstream.Msg) error { return nil }, opts...)
			return err
		},
		"DecodeBatch": func(l *ledger, opts ...idnats.HandlerOption) error {
			_, err := idnats.DecodeBatch(l.mw, nil, idnats.JSON[order], l.creditBatch, opts...)
			return err
		},
		"ProcessBatch": func(l *ledger, opts ...idnats.HandlerOption) error {
			_, err := idnats.ProcessBatch(l.mw, nil, func(context.Context, *sql.Tx, []jetstream.Msg) error { return nil }, opts...)
			return err
		},
	}
	for name, f := range build {
		t.Run(name, func(t *testing.T) {
			err := f(l, idnats.WithoutEventTime())
			if !errors.Is(err, adapter.ErrNoProducerEventTime) {
				t.Fatalf("partitioned, WithoutEventTime: %v, want adapter.ErrNoProducerEventTime", err)
			}
			t.Logf("refused: %v", err)
			if err := f(l, idnats.WithTransportEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
				t.Fatalf("partitioned, WithTransportEventTime (the stream's time, no producer's): %v, want adapter.ErrNoProducerEventTime", err)
			}
			for what, opts := range map[string][]idnats.HandlerOption{
				"the header (default)": nil,
				"WithEventTime":        {idnats.WithEventTime(idnats.TimeHeader("Event-Time"))},
			} {
				if err := f(l, opts...); err != nil {
					t.Errorf("partitioned, %s: %v", what, err)
				}
			}
			if err := f(plain, idnats.WithoutEventTime()); err != nil {
				t.Errorf("plain table, WithoutEventTime: %v", err)
			}
			if err := f(l, idnats.WithoutEventTime(), idnats.WithTransportEventTime()); err == nil {
				t.Error("two event-time options: no error")
			}
		})
	}
}

// TestFutureDatedMessageIsRequeuedUntilTheClockCatchesUp is issue 21 case
// 3: a message dated ahead of the Middleware's clock (plus its clock-skew
// margin) but within the settle rule's bound is naked with a delay and
// applied once the clock has caught up; one dated beyond the bound is
// terminated exactly once and writes nothing.
func TestFutureDatedMessageIsRequeuedUntilTheClockCatchesUp(t *testing.T) {
	t.Parallel()
	var now atomic.Int64 // the Middleware's clock, in Unix nanoseconds
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	inEachMode(t, []idempotent.Option{idempotent.WithClock(clock)}, func(t *testing.T, l modeRun) {
		now.Store(time.Now().UnixNano())
		soon := order{OrderID: 1, CustomerID: 4, Points: 10}
		far := order{OrderID: 2, CustomerID: 4, Points: 20}
		publishOrder(t, l.js, l.subject, far, clock().Add(2*adapter.DefaultFutureBound), "")
		publishOrder(t, l.js, l.subject, soon, clock().Add(l.mw.ClockSkew()+200*time.Millisecond), "")

		var got settlements
		// One worker: the clock moves on in the settle callback of the
		// nak, before the worker fetches again.
		c, err := l.consumer(nil, idnats.WithWorkers(1), idnats.WithFetchWait(50*time.Millisecond), idnats.WithNakDelay(10*time.Millisecond, 50*time.Millisecond),
			idnats.WithOnSettle(func(ctx context.Context, st idnats.Settlement) {
				if st.Action == idnats.Naked {
					now.Add(int64(time.Minute))
				}
				got.add(ctx, st)
			}))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s idnats.Stats) bool { return s.Acked+s.Terminated >= 2 })
		naked, terminated := got.with(idnats.Naked), got.with(idnats.Terminated)
		if len(terminated) != 1 || !errors.Is(terminated[0].Err, idempotent.ErrInvalidEventTime) || terminated[0].Msg.Headers().Get("Order-Key") != far.Key() {
			t.Fatalf("terminated %v, want %s once, with ErrInvalidEventTime", terminated, far.Key())
		}
		t.Logf("terminated: %v", terminated[0].Err)
		if len(naked) != 1 || naked[0].Msg.Headers().Get("Order-Key") != soon.Key() || naked[0].Delay < 200*time.Millisecond {
			t.Fatalf("naked %+v, want %s once, with a delay of at least 200ms (until the clock catches up)", naked, soon.Key())
		}
		if st := c.Stats(); st.Applied != 1 || st.Acked != 1 || st.Terminated != 1 || st.Naked != 1 {
			t.Fatalf("stats %+v, want 1 naked then applied, 1 terminated", st)
		}
		if np, ap, err := pending(t, l.cons); err != nil || np != 0 || ap != 0 {
			t.Fatalf("consumer pending %d, ack pending %d (%v), want 0 and 0", np, ap, err)
		}
		l.audit(t, []order{soon})
	})
}

// TestBadEventTimeHeaderIsPoison: an Idempotent-Event-Time header that is
// not an RFC 3339 time terminates the message (its re-sends carry the same
// value), nothing written — per message and in batches, where it does not
// hold back the good message beside it.
func TestBadEventTimeHeaderIsPoison(t *testing.T) {
	t.Parallel()
	inEachMode(t, nil, func(t *testing.T, l modeRun) {
		bad := order{OrderID: 1, CustomerID: 5, Points: 10}
		good := order{OrderID: 2, CustomerID: 5, Points: 20}
		publishOrder(t, l.js, l.subject, bad, time.Time{}, "1767225600") // seconds, not RFC 3339
		publishOrder(t, l.js, l.subject, good, time.Now(), "")

		var got settlements
		c, err := l.consumer(nil, idnats.WithWorkers(1), idnats.WithFetchWait(50*time.Millisecond), idnats.WithOnSettle(got.add))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s idnats.Stats) bool { return s.Acked+s.Terminated+s.Naked >= 2 })
		terminated := got.with(idnats.Terminated)
		if len(terminated) != 1 || !errors.Is(terminated[0].Err, adapter.ErrBadEventTime) || terminated[0].Msg.Headers().Get("Order-Key") != bad.Key() {
			t.Fatalf("terminated %v, want %s once, with adapter.ErrBadEventTime", terminated, bad.Key())
		}
		t.Logf("terminated: %v", terminated[0].Err)
		if st := c.Stats(); st.Applied != 1 || st.Acked != 1 || st.Terminated != 1 || st.Naked != 0 {
			t.Fatalf("stats %+v, want 1 applied, 1 terminated", st)
		}
		l.audit(t, []order{good})
	})
}
