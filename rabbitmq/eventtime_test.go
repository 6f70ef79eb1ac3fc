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
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

var eventNow = time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)

const effectSQL = "UPDATE balances SET points = points + 50 WHERE customer_id = 7"

// TestEventTime runs Process and Decode WithEventTime on a partitioned
// Middleware, against the statements it must send: the claim in the event
// day's partition, or nothing at all for a delivery that is poison.
func TestEventTime(t *testing.T) {
	t.Parallel()
	stamped := amqp.Delivery{MessageId: "order-completed:9912", Timestamp: eventNow.Add(-13 * time.Hour), Body: []byte(`{"points": 50}`)}
	old := stamped
	old.Timestamp = eventNow.AddDate(0, 0, -40)
	unstamped := stamped
	unstamped.Timestamp = time.Time{}
	type msg struct{ Points int }
	build := map[string]func(mw *idempotent.Middleware) rabbitmq.Handler{
		"process": func(mw *idempotent.Middleware) rabbitmq.Handler {
			return rabbitmq.Process(mw, rabbitmq.MessageID(), func(ctx context.Context, tx *sql.Tx, _ *amqp.Delivery) error {
				_, err := tx.ExecContext(ctx, effectSQL)
				return err
			}, rabbitmq.WithEventTime(rabbitmq.Timestamp()))
		},
		"decode": func(mw *idempotent.Middleware) rabbitmq.Handler {
			return rabbitmq.Decode(mw, rabbitmq.MessageID(), rabbitmq.JSON[msg], func(ctx context.Context, tx *sql.Tx, m msg) error {
				if m.Points != 50 {
					t.Errorf("decoded %+v", m)
				}
				_, err := tx.ExecContext(ctx, effectSQL)
				return err
			}, rabbitmq.WithEventTime(rabbitmq.Timestamp()))
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
			m.ExpectAppliedAt(stamped.MessageId, stamped.Timestamp)
			m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectCommit()
		}, idempotent.Applied, nil, false},
		{"duplicate", stamped, func(m *mocks.Mock) {
			m.ExpectDuplicateAt(stamped.MessageId, stamped.Timestamp)
		}, idempotent.Duplicate, nil, false},
		{"no partition yet", stamped, func(m *mocks.Mock) {
			m.ExpectClaimErrorAt(stamped.MessageId, stamped.Timestamp, &pq.Error{Code: "23514"})
		}, 0, idempotent.ErrNoPartition, false},
		{"beyond retention", old, func(m *mocks.Mock) { m.ExpectFenced(old.Timestamp) }, 0, idempotent.ErrBeyondRetention, true},
		{"no timestamp", unstamped, func(*mocks.Mock) {}, 0, rabbitmq.ErrNoEventTime, true},
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
			h := rabbitmq.Process(mw, rabbitmq.MessageID(), func(context.Context, *sql.Tx, *amqp.Delivery) error {
				t.Error("the handler ran")
				return nil
			}, rabbitmq.WithEventTime(c.f))
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

// TestEventTimeSetupMistakes: a partitioned Middleware without
// WithEventTime, or a nil function or option, is refused when the Handler
// is built.
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
	cases := []struct {
		name string
		f    func()
		want string
	}{
		{"partitioned without event time", func() { rabbitmq.Process(partitioned, rabbitmq.MessageID(), fn) }, "add WithEventTime"},
		{"decode, partitioned without event time", func() {
			rabbitmq.Decode(partitioned, rabbitmq.MessageID(), rabbitmq.JSON[struct{}], func(context.Context, *sql.Tx, struct{}) error { return nil })
		}, "add WithEventTime"},
		{"nil event time function", func() { rabbitmq.Process(plain, rabbitmq.MessageID(), fn, rabbitmq.WithEventTime(nil)) }, "nil function"},
		{"nil option", func() { rabbitmq.Process(plain, rabbitmq.MessageID(), fn, nil) }, "nil option"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				p := recover()
				if s, ok := p.(string); !ok || !strings.Contains(s, c.want) {
					t.Fatalf("panic %v, want one containing %q", p, c.want)
				}
			}()
			c.f()
		})
	}
}
