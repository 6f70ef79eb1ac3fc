package nats_test

import (
	"context"
	"errors"
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
	new  func(l *ledger, opts ...idnats.Option) (*idnats.Consumer, error)
}{
	{"per-message", func(l *ledger, opts ...idnats.Option) (*idnats.Consumer, error) {
		return idnats.NewConsumer(l.mw, l.handler(), opts...)
	}},
	{"batch", func(l *ledger, opts ...idnats.Option) (*idnats.Consumer, error) {
		return idnats.NewBatchConsumer(l.mw, l.batchHandler(), append(opts, idnats.WithBatchSize(10))...)
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

// modeRun is what each mode's run of a test gets: a stream of its own, a
// durable "loyalty" on it, and a ledger on a schema of its own.
type modeRun struct {
	*ledger
	js      jetstream.JetStream
	subject string
	cons    jetstream.Consumer
	// consumer builds the mode's Consumer on the ledger, keyed by the
	// Order-Key header.
	consumer func(opts ...idnats.Option) (*idnats.Consumer, error)
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
			r.consumer = func(opts ...idnats.Option) (*idnats.Consumer, error) {
				return m.new(r.ledger, append([]idnats.Option{idnats.WithKey(orderKey)}, opts...)...)
			}
			f(t, r)
		})
	}
}

// runUntil runs c on cons until done holds for its Stats, then shuts it
// down gracefully.
func runUntil(t *testing.T, c *idnats.Consumer, cons jetstream.Consumer, what string, done func(adapter.Stats) bool) {
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

// TestResentMessageKeepsItsEventTimeHeaderAndIsDuplicateOnPartitionedTable:
// on a day-partitioned claim table, a Consumer with no event-time option
// reads the producer's event time from the Idempotent-Event-Time header.
// The key is produced at now−24h and re-sent now: a new stream message
// with a new stream timestamp, but the same header, so both claims go to
// yesterday's partition: one Applied, one Duplicate, one effect — per
// message and in batches.
func TestResentMessageKeepsItsEventTimeHeaderAndIsDuplicateOnPartitionedTable(t *testing.T) {
	t.Parallel()
	inEachMode(t, []idempotent.Option{idempotent.WithDailyPartitions(1), idempotent.WithRetention(3 * 24 * time.Hour)}, func(t *testing.T, l modeRun) {
		o := order{OrderID: 9912, CustomerID: 7, Points: 15}
		produced := time.Now().Add(-24 * time.Hour)
		publishOrder(t, l.js, l.subject, o, produced, "")
		publishOrder(t, l.js, l.subject, o, produced, "") // the re-send

		var got events
		c, err := l.consumer(idnats.WithFetchWait(50*time.Millisecond), idnats.WithObserver(&got))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s adapter.Stats) bool { return settledAll(s) >= 2 })
		for _, ev := range append(got.of(adapter.EventApplied), got.of(adapter.EventDuplicate)...) {
			if !ev.Message.EventTime.Equal(produced) || ev.Message.Key != o.Key() {
				t.Errorf("%v: message %+v, want key %s and event time %v (the header)", ev.Type, ev.Message, o.Key(), produced)
			}
		}
		if st := c.Stats(); st.Applied != 1 || st.Duplicates != 1 || st.Requeued+st.DeadLettered+st.SettleFailed != 0 {
			t.Fatalf("stats %+v, want 1 applied and 1 duplicate, both acked", st)
		}
		l.audit(t, []order{o})
	})
}

// TestTransportEventTimeIsTheStreamTimestamp: WithTransportEventTime reads
// the time the stream stored each message, not the header.
func TestTransportEventTimeIsTheStreamTimestamp(t *testing.T) {
	t.Parallel()
	inEachMode(t, nil, func(t *testing.T, l modeRun) {
		o := order{OrderID: 3, CustomerID: 2, Points: 5}
		publishOrder(t, l.js, l.subject, o, time.Now().Add(-5*time.Hour), "")
		var got events
		c, err := l.consumer(idnats.WithTransportEventTime(), idnats.WithFetchWait(50*time.Millisecond), idnats.WithObserver(&got))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "the message applied", func(s adapter.Stats) bool { return s.Applied == 1 })
		ev := got.of(adapter.EventApplied)[0]
		md, err := ev.Detail.(jetstream.Msg).Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if !ev.Message.EventTime.Equal(md.Timestamp) || time.Since(md.Timestamp) > time.Hour {
			t.Fatalf("event time %v, want the stream's timestamp %v", ev.Message.EventTime, md.Timestamp)
		}
		l.audit(t, []order{o})
	})
}

// TestPartitionedTableWithoutEventTimeIsRefusedAtConstruction: a Consumer
// that reads no producer's event time cannot claim on a day-partitioned
// table, so both constructors refuse it — never a terminated message
// later. The default (the header) and an explicit source are accepted.
func TestPartitionedTableWithoutEventTimeIsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 2)
	l := newLedger(t, db, "loyalty", idempotent.WithDailyPartitions(1), idempotent.WithRetention(2*24*time.Hour))
	plain := newLedger(t, db, "loyalty")
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			_, err := m.new(l, idnats.WithoutEventTime())
			if !errors.Is(err, adapter.ErrNoProducerEventTime) {
				t.Fatalf("partitioned, WithoutEventTime: %v, want adapter.ErrNoProducerEventTime", err)
			}
			t.Logf("refused: %v", err)
			if _, err := m.new(l, idnats.WithTransportEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
				t.Fatalf("partitioned, WithTransportEventTime (the stream's time, no producer's): %v, want adapter.ErrNoProducerEventTime", err)
			}
			for what, opts := range map[string][]idnats.Option{
				"the header (default)": nil,
				"WithEventTime":        {idnats.WithEventTime(idnats.TimeHeader("Event-Time"))},
			} {
				if _, err := m.new(l, opts...); err != nil {
					t.Errorf("partitioned, %s: %v", what, err)
				}
			}
			if _, err := m.new(plain, idnats.WithoutEventTime()); err != nil {
				t.Errorf("plain table, WithoutEventTime: %v", err)
			}
			if _, err := m.new(plain, idnats.WithoutEventTime(), idnats.WithTransportEventTime()); err == nil {
				t.Error("two event-time options: no error")
			}
		})
	}
}

// TestFutureDatedMessageIsRequeuedUntilTheClockCatchesUp: a message dated
// ahead of the Middleware's clock (plus its clock-skew margin) but within
// the settle rule's bound is naked with a delay and applied once the clock
// has caught up; one dated beyond the bound is terminated exactly once
// and writes nothing.
func TestFutureDatedMessageIsRequeuedUntilTheClockCatchesUp(t *testing.T) {
	t.Parallel()
	var now atomic.Int64 // the Middleware's clock, in Unix nanoseconds
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	inEachMode(t, []idempotent.Option{idempotent.WithClock(clock)}, func(t *testing.T, l modeRun) {
		now.Store(time.Now().UnixNano())
		soon := order{OrderID: 1, CustomerID: 4, Points: 10}
		far := order{OrderID: 2, CustomerID: 4, Points: 20}
		publishOrder(t, l.js, l.subject, far, clock().Add(2*adapter.DefaultFutureBound), "")
		publishOrder(t, l.js, l.subject, soon, clock().Add(l.mw.Config().ClockSkew+200*time.Millisecond), "")

		var got events
		// One worker: the clock moves on in the observer, when the nak is
		// reported, before the worker fetches again.
		c, err := l.consumer(idnats.WithFetchWait(50*time.Millisecond), idnats.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond),
			idnats.WithObserver(adapter.ObserverFunc(func(ctx context.Context, ev adapter.Event) {
				if ev.Type == adapter.EventRequeued {
					now.Add(int64(time.Minute))
				}
				got.Observe(ctx, ev)
			})))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s adapter.Stats) bool { return s.Applied+s.DeadLettered >= 2 })
		naked, terminated := got.of(adapter.EventRequeued), got.of(adapter.EventDeadLettered)
		if len(terminated) != 1 || !errors.Is(terminated[0].Err, idempotent.ErrInvalidEventTime) || terminated[0].Message.Key != far.Key() {
			t.Fatalf("terminated %v, want %s once, with ErrInvalidEventTime", terminated, far.Key())
		}
		t.Logf("terminated: %v", terminated[0].Err)
		if len(naked) != 1 || naked[0].Message.Key != soon.Key() || naked[0].Delay < 200*time.Millisecond || naked[0].Attempt != 1 {
			t.Fatalf("naked %+v, want %s once, on its first attempt, with a delay of at least 200ms (until the clock catches up)", naked, soon.Key())
		}
		if st := c.Stats(); st.Applied != 1 || st.DeadLettered != 1 || st.Requeued != 1 || st.SettleFailed != 0 {
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

		var got events
		c, err := l.consumer(idnats.WithFetchWait(50*time.Millisecond), idnats.WithObserver(&got))
		if err != nil {
			t.Fatal(err)
		}
		runUntil(t, c, l.cons, "both settled", func(s adapter.Stats) bool { return settledAll(s) >= 2 })
		terminated := got.of(adapter.EventDeadLettered)
		if len(terminated) != 1 || !errors.Is(terminated[0].Err, adapter.ErrBadEventTime) || terminated[0].Message.Key != bad.Key() {
			t.Fatalf("terminated %v, want %s once, with adapter.ErrBadEventTime", terminated, bad.Key())
		}
		t.Logf("terminated: %v", terminated[0].Err)
		if st := c.Stats(); st.Applied != 1 || st.DeadLettered != 1 || st.Requeued != 0 {
			t.Fatalf("stats %+v, want 1 applied, 1 terminated", st)
		}
		l.audit(t, []order{good})
	})
}
