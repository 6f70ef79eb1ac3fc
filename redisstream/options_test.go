package redisstream_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/redisstream"
)

// offline returns a plain and a day-partitioned Middleware on a database
// that is never connected to.
func offline(t *testing.T) (mw, parted *idempotent.Middleware, db *sql.DB) {
	t.Helper()
	db, err := sql.Open("postgres", "postgres://127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err = idempotent.New(db, postgres.New(), "c")
	if err != nil {
		t.Fatal(err)
	}
	parted, err = idempotent.New(db, postgres.New(), "c", idempotent.WithDailyPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	return mw, parted, db
}

// notPostgres is a dialect of another name: the outbox, Postgres only,
// refuses it.
type notPostgres struct{ dialect.Dialect }

func (notPostgres) Name() string { return "mysql" }

func TestNewConsumerRefusesBadInput(t *testing.T) {
	mw, parted, db := offline(t)
	ob, err := outbox.New(db, "c")
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *sql.Tx, *redisstream.Delivery) error { return nil }
	other, err := idempotent.New(db, notPostgres{postgres.New()}, "c")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		mw   *idempotent.Middleware
		h    redisstream.Handler
		opts []redisstream.Option
		want string
		is   error
	}{
		{"nil middleware", nil, h, nil, "nil Middleware", nil},
		{"nil handler", mw, nil, nil, "nil handler", nil},
		{"nil option", mw, h, []redisstream.Option{nil}, "nil option", nil},
		{"nil key", mw, h, []redisstream.Option{redisstream.WithKey(nil)}, "WithKey", nil},
		{"nil event time", mw, h, []redisstream.Option{redisstream.WithEventTime(nil)}, "WithEventTime", nil},
		{"workers", mw, h, []redisstream.Option{redisstream.WithWorkers(0)}, "WithWorkers", nil},
		{"batch size for a per-message consumer", mw, h, []redisstream.Option{redisstream.WithBatchSize(10)}, "WithBatchSize is for NewBatchConsumer", nil},
		{"retry delay order", mw, h, []redisstream.Option{redisstream.WithRetryDelay(time.Second, time.Millisecond)}, "WithRetryDelay", nil},
		{"future bound", mw, h, []redisstream.Option{redisstream.WithFutureBound(0)}, "WithFutureBound", nil},
		{"shutdown", mw, h, []redisstream.Option{redisstream.WithShutdownTimeout(0)}, "WithShutdownTimeout", nil},
		{"poison", mw, h, []redisstream.Option{redisstream.WithPoison(nil)}, "WithPoison", nil},
		{"observer", mw, h, []redisstream.Option{redisstream.WithObserver(nil)}, "WithObserver", nil},
		{"consumer name", mw, h, []redisstream.Option{redisstream.WithConsumerName("")}, "WithConsumerName", nil},
		{"claim idle", mw, h, []redisstream.Option{redisstream.WithClaimIdle(time.Millisecond)}, "WithClaimIdle", nil},
		{"block", mw, h, []redisstream.Option{redisstream.WithBlock(0)}, "WithBlock", nil},
		{"max deliveries", mw, h, []redisstream.Option{redisstream.WithMaxDeliveries(0)}, "WithMaxDeliveries", nil},
		{"dead letter outbox", mw, h, []redisstream.Option{redisstream.WithDeadLetter(nil, "dead")}, "WithDeadLetter", nil},
		{"dead letter stream", mw, h, []redisstream.Option{redisstream.WithDeadLetter(ob, "")}, "WithDeadLetter", nil},
		{"dead letter on another dialect", other, h, []redisstream.Option{redisstream.WithDeadLetter(ob, "dead")}, "WithDeadLetter: the outbox is Postgres only", nil},
		{"partitioned without an event time", parted, h, []redisstream.Option{redisstream.WithoutEventTime()}, "redisstream", adapter.ErrNoProducerEventTime},
		{"partitioned with the entry id's time", parted, h, []redisstream.Option{redisstream.WithTransportEventTime()}, "entry id", adapter.ErrNoProducerEventTime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := redisstream.NewConsumer(tt.mw, tt.h, tt.opts...)
			if err == nil || c != nil {
				t.Fatalf("NewConsumer = %v, %v; want an error", c, err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "redisstream") {
				t.Fatalf("error %q, want it to name the adapter and contain %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("error %v does not match %v", err, tt.is)
			}
		})
	}
	// What the partitioned Middleware accepts: the default field, or a
	// function of the producer's.
	for _, opts := range [][]redisstream.Option{nil, {redisstream.WithEventTime(redisstream.TimeField("at"))}} {
		if _, err := redisstream.NewConsumer(parted, h, opts...); err != nil {
			t.Fatalf("partitioned Middleware with %d options: %v", len(opts), err)
		}
	}
	if _, err := redisstream.NewBatchConsumer(mw, nil); err == nil {
		t.Fatal("NewBatchConsumer accepted a nil handler")
	}
	if _, err := redisstream.NewBatchConsumer(mw, func(context.Context, *sql.Tx, []*redisstream.Delivery) error { return nil },
		redisstream.WithBatchSize(redisstream.MaxBatchSize+1)); err == nil {
		t.Fatal("NewBatchConsumer accepted a batch size above MaxBatchSize")
	}
}

func TestConsumerNames(t *testing.T) {
	mw, _, _ := offline(t)
	h := func(context.Context, *sql.Tx, *redisstream.Delivery) error { return nil }
	a, err := redisstream.NewConsumer(mw, h)
	if err != nil {
		t.Fatal(err)
	}
	b, err := redisstream.NewConsumer(mw, h)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name() == "" || a.Name() == b.Name() {
		t.Fatalf("default names %q and %q, want two different ones", a.Name(), b.Name())
	}
	c, err := redisstream.NewConsumer(mw, h, redisstream.WithConsumerName("loyalty-1"))
	if err != nil || c.Name() != "loyalty-1" {
		t.Fatalf("WithConsumerName: %v, %v", c, err)
	}
}

func TestRunRefusesBadInput(t *testing.T) {
	mw, _, _ := offline(t)
	c, err := redisstream.NewConsumer(mw, func(context.Context, *sql.Tx, *redisstream.Delivery) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background(), nil, "s", "g"); err == nil {
		t.Fatal("Run accepted a nil client")
	}
}

func TestKeyFuncs(t *testing.T) {
	d := &redisstream.Delivery{Stream: "orders", ID: "1796117400123-0", Count: 1, Values: map[string]string{
		redisstream.DefaultKeyField: "order-completed:9912",
		redisstream.PayloadField:    `{"order": {"id": 9912, "ref": "A-1"}}`,
		"empty":                     "",
	}}
	tests := []struct {
		name string
		k    redisstream.KeyFunc
		want string
		is   error
	}{
		{"field", redisstream.Field(redisstream.DefaultKeyField), "order-completed:9912", nil},
		{"missing field", redisstream.Field("nope"), "", adapter.ErrNoKey},
		{"empty field", redisstream.Field("empty"), "", adapter.ErrNoKey},
		{"body field number", redisstream.BodyField("order", "id"), "9912", nil},
		{"body field string", redisstream.BodyField("order", "ref"), "A-1", nil},
		{"missing body field", redisstream.BodyField("order", "nope"), "", adapter.ErrNoKey},
		{"prefixed", redisstream.Prefixed("loyalty:", redisstream.BodyField("order", "ref")), "loyalty:A-1", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.k(d)
			if tt.is != nil {
				if !errors.Is(err, tt.is) {
					t.Fatalf("key %q, %v; want an error matching %v", got, err, tt.is)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("key %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	bad := &redisstream.Delivery{Values: map[string]string{redisstream.PayloadField: "not json"}}
	if _, err := redisstream.BodyField("id")(bad); !errors.Is(err, adapter.ErrUndecodable) {
		t.Fatalf("BodyField of a payload that is not JSON: %v, want ErrUndecodable", err)
	}
}

func TestTimes(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.UTC)
	d := &redisstream.Delivery{ID: "1796117400123-7", Values: map[string]string{"at": adapter.FormatEventTime(at), "bad": "yesterday"}}
	if got := d.Time(); !got.Equal(time.UnixMilli(1796117400123)) {
		t.Fatalf("Time %v, want the id's milliseconds", got)
	}
	for _, id := range []string{"", "x-1", "0-1", "12"} {
		if got := (&redisstream.Delivery{ID: id}).Time(); !got.IsZero() {
			t.Fatalf("Time of id %q = %v, want zero", id, got)
		}
	}
	if got, err := redisstream.TimeField("at")(d); err != nil || !got.Equal(at) {
		t.Fatalf("TimeField = %v, %v; want %v", got, err, at)
	}
	if _, err := redisstream.TimeField("bad")(d); !errors.Is(err, adapter.ErrBadEventTime) {
		t.Fatalf("TimeField of a bad value: %v, want ErrBadEventTime", err)
	}
	if _, err := redisstream.TimeField("nope")(d); !errors.Is(err, adapter.ErrNoEventTime) {
		t.Fatalf("TimeField of a missing field: %v, want ErrNoEventTime", err)
	}
}

func TestDecode(t *testing.T) {
	type order struct{ ID int }
	var got order
	h := redisstream.Decode(redisstream.JSON[order], func(_ context.Context, _ *sql.Tx, o order, _ *redisstream.Delivery) error {
		got = o
		return nil
	})
	if err := h(context.Background(), nil, &redisstream.Delivery{Values: map[string]string{redisstream.PayloadField: `{"ID": 7, "new": true}`}}); err != nil || got.ID != 7 {
		t.Fatalf("Decode: %v, %+v", err, got)
	}
	err := h(context.Background(), nil, &redisstream.Delivery{Stream: "orders", ID: "1-0", Values: map[string]string{}})
	if !errors.Is(err, adapter.ErrUndecodable) || !adapter.IsPoison(err) || !strings.Contains(err.Error(), "orders/1-0") {
		t.Fatalf("Decode of an entry without a payload: %v, want poison naming the entry", err)
	}
}
