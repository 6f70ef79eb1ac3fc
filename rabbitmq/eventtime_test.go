package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

var eventNow = time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)

const effectSQL = "UPDATE balances SET points = points + 50 WHERE customer_id = 7"

// settleOne runs one delivery through a Consumer of mw with opts and
// returns the event of its settlement.
func settleOne(t *testing.T, mw *idempotent.Middleware, h rabbitmq.Handler, d amqp.Delivery, opts ...rabbitmq.Option) adapter.Event {
	t.Helper()
	var rec recorder
	c := newConsumer(t, mw, h, append([]rabbitmq.Option{rabbitmq.WithObserver(&rec), rabbitmq.WithRetryDelay(time.Millisecond, time.Millisecond)}, opts...)...)
	f := newFakeChannel()
	stop, _ := start(t, c, f)
	f.deliver(d)
	waitFor(t, "the settlement", func() bool { return len(rec.all()) > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return rec.all()[0]
}

// credit is the effect of the event-time tests.
func credit(ctx context.Context, tx *sql.Tx, _ *amqp.Delivery) error {
	_, err := tx.ExecContext(ctx, effectSQL)
	return err
}

// TestEventTime runs deliveries through a Consumer of a partitioned
// Middleware, the event time read from the adapter.EventTimeHeader header,
// against the statements it must send: the claim in the event day's
// partition, or nothing at all for a delivery that is poison or dated
// ahead of the clock.
func TestEventTime(t *testing.T) {
	t.Parallel()
	at := eventNow.Add(-13 * time.Hour)
	stamped := headerDelivery("order-completed:9912", at, `{"points": 50}`)
	// A transport timestamp a day later, as a re-send stamps it, changes nothing.
	stamped.Timestamp = eventNow
	old := headerDelivery("order-completed:9912", eventNow.AddDate(0, 0, -40), `{"points": 50}`)
	unstamped := amqp.Delivery{MessageId: "order-completed:9912", Timestamp: eventNow, Body: []byte(`{"points": 50}`)}
	badHeader := headerDelivery("order-completed:9912", at, `{"points": 50}`)
	badHeader.Headers[adapter.EventTimeHeader] = "1773489600" // seconds, not RFC 3339
	intHeader := headerDelivery("order-completed:9912", at, `{"points": 50}`)
	intHeader.Headers[adapter.EventTimeHeader] = int64(1773489600)
	soon := headerDelivery("order-completed:9912", eventNow.Add(30*time.Minute), `{"points": 50}`)
	farAhead := headerDelivery("order-completed:9912", eventNow.Add(2*adapter.DefaultFutureBound), `{"points": 50}`)
	cases := []struct {
		name    string
		d       amqp.Delivery
		script  func(m *mocks.Mock)
		want    adapter.EventType
		wantErr error
	}{
		{"applied", stamped, func(m *mocks.Mock) {
			m.ExpectAppliedAt(stamped.MessageId, at)
			m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectCommit()
		}, adapter.EventApplied, nil},
		{"duplicate", stamped, func(m *mocks.Mock) {
			m.ExpectDuplicateAt(stamped.MessageId, at)
		}, adapter.EventDuplicate, nil},
		{"no partition yet", stamped, func(m *mocks.Mock) {
			m.ExpectClaimErrorAt(stamped.MessageId, at, &pq.Error{Code: "23514"})
		}, adapter.EventRequeued, idempotent.ErrNoPartition},
		{"beyond retention", old, func(m *mocks.Mock) { m.ExpectFenced(eventNow.AddDate(0, 0, -40)) }, adapter.EventDeadLettered, idempotent.ErrBeyondRetention},
		{"no header", unstamped, func(*mocks.Mock) {}, adapter.EventDeadLettered, adapter.ErrNoEventTime},
		{"bad header", badHeader, func(*mocks.Mock) {}, adapter.EventDeadLettered, adapter.ErrBadEventTime},
		{"header not a string", intHeader, func(*mocks.Mock) {}, adapter.EventDeadLettered, adapter.ErrBadEventTime},
		{"ahead of the clock, within the bound", soon, func(*mocks.Mock) {}, adapter.EventRequeued, idempotent.ErrInvalidEventTime},
		{"ahead of the clock, beyond the bound", farAhead, func(*mocks.Mock) {}, adapter.EventDeadLettered, idempotent.ErrInvalidEventTime},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, mock := mocks.New(t)
			mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1),
				idempotent.WithClock(func() time.Time { return eventNow }))
			if err != nil {
				t.Fatal(err)
			}
			c.script(mocks.ForMiddleware(mock, mw))
			e := settleOne(t, mw, credit, c.d)
			if e.Type != c.want || (c.wantErr == nil) != (e.Err == nil) || (c.wantErr != nil && !errors.Is(e.Err, c.wantErr)) {
				t.Fatalf("settled %v (%v), want %v (%v)", e.Type, e.Err, c.want, c.wantErr)
			}
			if e.Message.Key != c.d.MessageId {
				t.Errorf("event key %q, want %q", e.Message.Key, c.d.MessageId)
			}
		})
	}
}

// TestEventTimeFuncErrors: whatever an EventTimeFunc fails with, or a zero
// time it returns, makes the delivery poison, before any transaction.
func TestEventTimeFuncErrors(t *testing.T) {
	t.Parallel()
	errBadHeader := errors.New("header event-time is not a time")
	cases := []struct {
		name string
		f    rabbitmq.EventTimeFunc
		d    amqp.Delivery
		want []error
	}{
		{"own error", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, errBadHeader }, amqp.Delivery{MessageId: "k"}, []error{errBadHeader, idempotent.ErrInvalidEventTime}},
		{"marked poison", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, adapter.Poison(errBadHeader) }, amqp.Delivery{MessageId: "k"}, []error{errBadHeader, adapter.ErrPoison}},
		{"zero time", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, nil }, amqp.Delivery{MessageId: "k"}, []error{adapter.ErrNoEventTime}},
		{"TimeHeader, missing", rabbitmq.TimeHeader("Completed-At"), amqp.Delivery{MessageId: "k"}, []error{adapter.ErrNoEventTime}},
		{"TimeHeader, not RFC 3339", rabbitmq.TimeHeader("Completed-At"), amqp.Delivery{MessageId: "k", Headers: amqp.Table{"Completed-At": "yesterday"}}, []error{adapter.ErrBadEventTime}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, _ := mocks.New(t) // nothing scripted: nothing may be sent
			mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1))
			if err != nil {
				t.Fatal(err)
			}
			e := settleOne(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error {
				t.Error("the handler ran")
				return nil
			}, c.d, rabbitmq.WithEventTime(c.f))
			if e.Type != adapter.EventDeadLettered {
				t.Fatalf("settled %v (%v), want dead-lettered", e.Type, e.Err)
			}
			for _, w := range c.want {
				if !errors.Is(e.Err, w) {
					t.Errorf("got %v, want it to match %v", e.Err, w)
				}
			}
		})
	}
}

// TestTimeHeader: a producer's header of its own is read as the event
// time, and the claim goes into that day's partition.
func TestTimeHeader(t *testing.T) {
	t.Parallel()
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1), idempotent.WithClock(func() time.Time { return eventNow }))
	if err != nil {
		t.Fatal(err)
	}
	at := eventNow.Add(-20 * time.Hour)
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectAppliedAt("k", at)
	m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	d := amqp.Delivery{MessageId: "k", Headers: amqp.Table{"Completed-At": adapter.FormatEventTime(at), adapter.EventTimeHeader: adapter.FormatEventTime(eventNow)}}
	if e := settleOne(t, mw, credit, d, rabbitmq.WithEventTime(rabbitmq.TimeHeader("Completed-At"))); e.Type != adapter.EventApplied || !e.Message.EventTime.Equal(at) {
		t.Fatalf("settled %v at %v (%v), want applied at %v", e.Type, e.Message.EventTime, e.Err, at)
	}
}

// TestTransportEventTime: WithTransportEventTime reads the AMQP timestamp,
// and a delivery without one is poison, before any transaction.
func TestTransportEventTime(t *testing.T) {
	t.Parallel()
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithClock(func() time.Time { return eventNow }))
	if err != nil {
		t.Fatal(err)
	}
	old := eventNow.AddDate(0, 0, -40)
	mocks.ForMiddleware(mock, mw).ExpectFenced(old)
	// The header is not read: the timestamp decides.
	d := headerDelivery("k", eventNow, "")
	d.Timestamp = old
	noHandler := func(context.Context, *sql.Tx, *amqp.Delivery) error {
		t.Error("the handler ran")
		return nil
	}
	if e := settleOne(t, mw, noHandler, d, rabbitmq.WithTransportEventTime()); e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, idempotent.ErrBeyondRetention) {
		t.Fatalf("timestamp 40 days old: %v (%v), want dead-lettered with ErrBeyondRetention", e.Type, e.Err)
	}
	d.Timestamp = time.Time{}
	if e := settleOne(t, mw, noHandler, d, rabbitmq.WithTransportEventTime()); e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, adapter.ErrNoEventTime) {
		t.Fatalf("no timestamp: %v (%v), want dead-lettered with ErrNoEventTime", e.Type, e.Err)
	}
}

// TestWithoutEventTime: on a plain table a consumer that reads no event
// time claims a delivery with none, whatever its header says.
func TestWithoutEventTime(t *testing.T) {
	t.Parallel()
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectApplied("k")
	m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	d := amqp.Delivery{MessageId: "k", Headers: amqp.Table{adapter.EventTimeHeader: "not a time"}}
	if e := settleOne(t, mw, credit, d, rabbitmq.WithoutEventTime()); e.Type != adapter.EventApplied || !e.Message.EventTime.IsZero() {
		t.Fatalf("settled %v with event time %v (%v), want applied with none", e.Type, e.Message.EventTime, e.Err)
	}
}

// headerDelivery is a delivery whose producer set its event time in the
// adapter.EventTimeHeader header.
func headerDelivery(id string, at time.Time, body string) amqp.Delivery {
	return amqp.Delivery{MessageId: id, Headers: amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(at)}, Body: []byte(body)}
}
