package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
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

// TestEventTime runs Process and Decode on a partitioned Middleware, the
// event time read from the adapter.EventTimeHeader header, against the
// statements they must send: the claim in the event day's partition, or
// nothing at all for a delivery that is poison or dated ahead of the clock.
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
	type msg struct{ Points int }
	build := map[string]func(mw *idempotent.Middleware) rabbitmq.Handler{
		"process": func(mw *idempotent.Middleware) rabbitmq.Handler {
			return must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), func(ctx context.Context, tx *sql.Tx, _ *amqp.Delivery) error {
				_, err := tx.ExecContext(ctx, effectSQL)
				return err
			}))
		},
		"decode": func(mw *idempotent.Middleware) rabbitmq.Handler {
			return must(t)(rabbitmq.Decode(mw, rabbitmq.MessageID(), rabbitmq.JSON[msg], func(ctx context.Context, tx *sql.Tx, m msg) error {
				if m.Points != 50 {
					t.Errorf("decoded %+v", m)
				}
				_, err := tx.ExecContext(ctx, effectSQL)
				return err
			}))
		},
	}
	cases := []struct {
		name    string
		d       amqp.Delivery
		script  func(m *mocks.Mock)
		want    idempotent.Outcome
		wantErr error
		poison  bool
	}{
		{"applied", stamped, func(m *mocks.Mock) {
			m.ExpectAppliedAt(stamped.MessageId, at)
			m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectCommit()
		}, idempotent.Applied, nil, false},
		{"duplicate", stamped, func(m *mocks.Mock) {
			m.ExpectDuplicateAt(stamped.MessageId, at)
		}, idempotent.Duplicate, nil, false},
		{"no partition yet", stamped, func(m *mocks.Mock) {
			m.ExpectClaimErrorAt(stamped.MessageId, at, &pq.Error{Code: "23514"})
		}, 0, idempotent.ErrNoPartition, false},
		{"beyond retention", old, func(m *mocks.Mock) { m.ExpectFenced(eventNow.AddDate(0, 0, -40)) }, 0, idempotent.ErrBeyondRetention, true},
		{"no header", unstamped, func(*mocks.Mock) {}, 0, rabbitmq.ErrNoEventTime, true},
		{"bad header", badHeader, func(*mocks.Mock) {}, 0, adapter.ErrBadEventTime, true},
		{"header not a string", intHeader, func(*mocks.Mock) {}, 0, adapter.ErrBadEventTime, true},
		{"ahead of the clock, within the bound", soon, func(*mocks.Mock) {}, 0, idempotent.ErrInvalidEventTime, false},
		{"ahead of the clock, beyond the bound", farAhead, func(*mocks.Mock) {}, 0, idempotent.ErrInvalidEventTime, true},
	}
	for name, newHandler := range build {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				db, mock := mocks.New(t)
				mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1),
					idempotent.WithClock(func() time.Time { return eventNow }))
				if err != nil {
					t.Fatal(err)
				}
				c.script(mocks.ForMiddleware(mock, mw))
				d := c.d
				got, err := newHandler(mw)(context.Background(), &d)
				if c.wantErr == nil {
					if err != nil || got != c.want {
						t.Fatalf("got (%v, %v), want %v", got, err, c.want)
					}
					return
				}
				if !errors.Is(err, c.wantErr) || rabbitmq.IsPoison(err) != c.poison {
					t.Fatalf("got %v (poison %v), want %v (poison %v)", err, rabbitmq.IsPoison(err), c.wantErr, c.poison)
				}
			})
		}
	}
}

// TestEventTimeFuncErrors: whatever an EventTimeFunc fails with, or a zero
// time it returns, makes the delivery poison, before any transaction.
func TestEventTimeFuncErrors(t *testing.T) {
	t.Parallel()
	db, _ := mocks.New(t) // nothing scripted: nothing may be sent
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	errBadHeader := errors.New("header event-time is not a time")
	cases := []struct {
		name string
		f    rabbitmq.EventTimeFunc
		want []error
	}{
		{"own error", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, errBadHeader }, []error{errBadHeader, idempotent.ErrInvalidEventTime}},
		{"marked poison", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, rabbitmq.Poison(errBadHeader) }, []error{errBadHeader, rabbitmq.ErrPoison}},
		{"zero time", func(*amqp.Delivery) (time.Time, error) { return time.Time{}, nil }, []error{rabbitmq.ErrNoEventTime}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), func(context.Context, *sql.Tx, *amqp.Delivery) error {
				t.Error("the handler ran")
				return nil
			}, rabbitmq.WithEventTime(c.f)))
			_, err := h(context.Background(), &amqp.Delivery{MessageId: "k"})
			for _, w := range c.want {
				if !errors.Is(err, w) {
					t.Errorf("got %v, want it to match %v", err, w)
				}
			}
			if !rabbitmq.IsPoison(err) {
				t.Errorf("%v is not poison", err)
			}
		})
	}
}

// TestEventTimeSetupMistakes: a partitioned Middleware with the event time
// from the transport, a nil function or option, or two event time sources
// are refused when the Handler is built, with an error and no Handler.
func TestEventTimeSetupMistakes(t *testing.T) {
	t.Parallel()
	db, _ := mocks.New(t)
	partitioned, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }
	decodeFn := func(context.Context, *sql.Tx, struct{}) error { return nil }
	at := func(*amqp.Delivery) (time.Time, error) { return eventNow, nil }
	cases := []struct {
		name    string
		build   func() (rabbitmq.Handler, error)
		want    string
		wantErr error
	}{
		{"partitioned with the transport's time", func() (rabbitmq.Handler, error) {
			return rabbitmq.Process(partitioned, rabbitmq.MessageID(), fn, rabbitmq.WithTransportEventTime())
		}, "WithTransportEventTime", adapter.ErrNoProducerEventTime},
		{"decode, partitioned with the transport's time", func() (rabbitmq.Handler, error) {
			return rabbitmq.Decode(partitioned, rabbitmq.MessageID(), rabbitmq.JSON[struct{}], decodeFn, rabbitmq.WithTransportEventTime())
		}, "partitioned", adapter.ErrNoProducerEventTime},
		{"nil event time function", func() (rabbitmq.Handler, error) {
			return rabbitmq.Process(plain, rabbitmq.MessageID(), fn, rabbitmq.WithEventTime(nil))
		}, "nil function", nil},
		{"nil option", func() (rabbitmq.Handler, error) { return rabbitmq.Process(plain, rabbitmq.MessageID(), fn, nil) }, "nil option", nil},
		{"two sources", func() (rabbitmq.Handler, error) {
			return rabbitmq.Process(plain, rabbitmq.MessageID(), fn, rabbitmq.WithEventTime(at), rabbitmq.WithTransportEventTime())
		}, "already set", nil},
		{"nil middleware", func() (rabbitmq.Handler, error) { return rabbitmq.Process(nil, rabbitmq.MessageID(), fn) }, "nil middleware", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := c.build()
			if h != nil || err == nil || !strings.Contains(err.Error(), c.want) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
				t.Fatalf("got (%v, %v), want no handler and an error containing %q", h != nil, err, c.want)
			}
		})
	}
	// The header (the default) and a function are producers' times: accepted.
	for _, opts := range [][]rabbitmq.HandlerOption{nil, {rabbitmq.WithEventTime(at)}} {
		if _, err := rabbitmq.Process(partitioned, rabbitmq.MessageID(), fn, opts...); err != nil {
			t.Fatalf("partitioned with %d options: %v", len(opts), err)
		}
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
	h := must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), func(context.Context, *sql.Tx, *amqp.Delivery) error {
		t.Error("the handler ran")
		return nil
	}, rabbitmq.WithTransportEventTime()))
	old := eventNow.AddDate(0, 0, -40)
	mocks.ForMiddleware(mock, mw).ExpectFenced(old)
	// The header is not read: the timestamp decides.
	d := headerDelivery("k", eventNow, "")
	d.Timestamp = old
	if _, err := h(context.Background(), &d); !errors.Is(err, idempotent.ErrBeyondRetention) || !rabbitmq.IsPoison(err) {
		t.Fatalf("timestamp 40 days old: %v, want poison ErrBeyondRetention", err)
	}
	d.Timestamp = time.Time{}
	if _, err := h(context.Background(), &d); !errors.Is(err, rabbitmq.ErrNoEventTime) || !rabbitmq.IsPoison(err) {
		t.Fatalf("no timestamp: %v, want poison ErrNoEventTime", err)
	}
}

// headerDelivery is a delivery whose producer set its event time in the
// adapter.EventTimeHeader header.
func headerDelivery(id string, at time.Time, body string) amqp.Delivery {
	return amqp.Delivery{MessageId: id, Headers: amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(at)}, Body: []byte(body)}
}

// must returns a function that fails t on a Handler constructor's error.
func must(t testing.TB) func(rabbitmq.Handler, error) rabbitmq.Handler {
	return func(h rabbitmq.Handler, err error) rabbitmq.Handler {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
}
