package cdkpubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

func effect(context.Context, *sql.Tx, *pubsub.Message) error { return nil }

func batchEffect(context.Context, *sql.Tx, []*pubsub.Message) error { return nil }

// unitMiddleware returns a Middleware on a mock database that is sent
// nothing, plain or partitioned by event day.
func unitMiddleware(t *testing.T, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	db, _ := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// notPostgres is a dialect of another name: the outbox, Postgres only,
// refuses it.
type notPostgres struct{ dialect.Dialect }

func (notPostgres) Name() string { return "mysql" }

func TestNewConsumerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	mw := unitMiddleware(t)
	partitioned := unitMiddleware(t, idempotent.WithDailyPartitions(1))
	db, _ := mocks.New(t)
	ob, err := outbox.New(db, "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	at := func(*pubsub.Message) (time.Time, error) { return time.Now(), nil }
	odb, _ := mocks.New(t)
	other, err := idempotent.New(odb, notPostgres{postgres.New()}, "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		mw      *idempotent.Middleware
		h       cdkpubsub.Handler
		opts    []cdkpubsub.Option
		want    string
		wantErr error
	}{
		{"nil middleware", nil, effect, nil, "nil Middleware", nil},
		{"nil handler", mw, nil, nil, "nil handler", nil},
		{"nil option", mw, effect, []cdkpubsub.Option{nil}, "nil option", nil},
		{"nil key", mw, effect, []cdkpubsub.Option{cdkpubsub.WithKey(nil)}, "WithKey", nil},
		{"no workers", mw, effect, []cdkpubsub.Option{cdkpubsub.WithWorkers(0)}, "WithWorkers", nil},
		{"too many workers", mw, effect, []cdkpubsub.Option{cdkpubsub.WithWorkers(adapter.MaxWorkers + 1)}, "WithWorkers", nil},
		{"zero retry delay", mw, effect, []cdkpubsub.Option{cdkpubsub.WithRetryDelay(0, time.Second)}, "WithRetryDelay", nil},
		{"retry delay above its maximum", mw, effect, []cdkpubsub.Option{cdkpubsub.WithRetryDelay(2*time.Second, time.Second)}, "WithRetryDelay", nil},
		{"retry delay longer than a worker holds", mw, effect, []cdkpubsub.Option{cdkpubsub.WithRetryDelay(time.Second, cdkpubsub.MaxRetryDelay+time.Second)}, "longest a worker holds", nil},
		{"zero future bound", mw, effect, []cdkpubsub.Option{cdkpubsub.WithFutureBound(0)}, "WithFutureBound", nil},
		{"zero shutdown timeout", mw, effect, []cdkpubsub.Option{cdkpubsub.WithShutdownTimeout(0)}, "WithShutdownTimeout", nil},
		{"nil poison", mw, effect, []cdkpubsub.Option{cdkpubsub.WithPoison(nil)}, "WithPoison", nil},
		{"nil observer", mw, effect, []cdkpubsub.Option{cdkpubsub.WithObserver(nil)}, "WithObserver", nil},
		{"nil event time function", mw, effect, []cdkpubsub.Option{cdkpubsub.WithEventTime(nil)}, "WithEventTime", nil},
		{"two event time sources", mw, effect, []cdkpubsub.Option{cdkpubsub.WithEventTime(at), cdkpubsub.WithoutEventTime()}, "already set", nil},
		{"batch size", mw, effect, []cdkpubsub.Option{cdkpubsub.WithBatchSize(10)}, "NewBatchConsumer", nil},
		{"batch wait", mw, effect, []cdkpubsub.Option{cdkpubsub.WithBatchWait(time.Millisecond)}, "NewBatchConsumer", nil},
		{"nil dead-letter outbox", mw, effect, []cdkpubsub.Option{cdkpubsub.WithDeadLetter(nil, "dead-letter")}, "WithDeadLetter", nil},
		{"dead letter on another dialect", other, effect, []cdkpubsub.Option{cdkpubsub.WithDeadLetter(ob, "dead-letter")}, "WithDeadLetter: the outbox is Postgres only", nil},
		{"empty dead-letter kind", mw, effect, []cdkpubsub.Option{cdkpubsub.WithDeadLetter(ob, "")}, "WithDeadLetter", outbox.ErrInvalidKind},
		{"bad dead-letter kind", mw, effect, []cdkpubsub.Option{cdkpubsub.WithDeadLetter(ob, "dead letter")}, "WithDeadLetter", outbox.ErrInvalidKind},
		{"dead-letter kind starting with punctuation", mw, effect, []cdkpubsub.Option{cdkpubsub.WithDeadLetter(ob, ".dead")}, "WithDeadLetter", outbox.ErrInvalidKind},
		{"partitioned, no event time", partitioned, effect, []cdkpubsub.Option{cdkpubsub.WithoutEventTime()}, "WithoutEventTime", adapter.ErrNoProducerEventTime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cdkpubsub.NewConsumer(tc.mw, tc.h, tc.opts...)
			if err == nil || c != nil || !strings.Contains(err.Error(), tc.want) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("NewConsumer: (%v, %v), want an error mentioning %q", c, err, tc.want)
			}
		})
	}
	// The metadata key (the default) and a function are producers' times.
	for _, opts := range [][]cdkpubsub.Option{nil, {cdkpubsub.WithEventTime(at)}, {cdkpubsub.WithWorkers(8), cdkpubsub.WithDeadLetter(ob, "loyalty.dead-letter")}} {
		if _, err := cdkpubsub.NewConsumer(partitioned, effect, opts...); err != nil {
			t.Fatalf("partitioned with %d options: %v", len(opts), err)
		}
	}
}

func TestNewBatchConsumerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	mw := unitMiddleware(t)
	cases := []struct {
		name string
		h    cdkpubsub.BatchHandler
		opts []cdkpubsub.Option
		want string
	}{
		{"nil handler", nil, nil, "nil handler"},
		{"zero batch size", batchEffect, []cdkpubsub.Option{cdkpubsub.WithBatchSize(0)}, "WithBatchSize"},
		{"batch larger than a claim takes", batchEffect, []cdkpubsub.Option{cdkpubsub.WithBatchSize(idempotent.MaxBatchSize + 1)}, "WithBatchSize"},
		{"negative batch wait", batchEffect, []cdkpubsub.Option{cdkpubsub.WithBatchWait(-time.Millisecond)}, "WithBatchWait"},
		{"long batch wait", batchEffect, []cdkpubsub.Option{cdkpubsub.WithBatchWait(cdkpubsub.MaxBatchWait + time.Millisecond)}, "WithBatchWait"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cdkpubsub.NewBatchConsumer(mw, tc.h, tc.opts...)
			if err == nil || c != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewBatchConsumer: (%v, %v), want an error mentioning %q", c, err, tc.want)
			}
		})
	}
	if _, err := cdkpubsub.NewBatchConsumer(mw, batchEffect, cdkpubsub.WithBatchSize(idempotent.MaxBatchSize), cdkpubsub.WithBatchWait(0)); err != nil {
		t.Fatalf("NewBatchConsumer at the limits: %v", err)
	}
}

func TestRunRefusesANilSubscription(t *testing.T) {
	t.Parallel()
	c, err := cdkpubsub.NewConsumer(unitMiddleware(t), effect)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background(), nil); err == nil {
		t.Fatal("Run with a nil subscription: no error")
	}
}

func TestKeyFunctions(t *testing.T) {
	t.Parallel()
	msg := &pubsub.Message{
		Body:     []byte(`{"order": {"id": 9912}, "name": ""}`),
		Metadata: map[string]string{cdkpubsub.DefaultKeyMetadata: "order-completed:9912", "Order-Key": "k1", "empty": ""},
	}
	cases := []struct {
		name    string
		k       cdkpubsub.KeyFunc
		want    string
		wantErr error
	}{
		{"default metadata key", cdkpubsub.Metadata(cdkpubsub.DefaultKeyMetadata), "order-completed:9912", nil},
		{"metadata", cdkpubsub.Header("Order-Key"), "k1", nil},
		{"metadata keys are case-sensitive", cdkpubsub.Metadata("order-key"), "", adapter.ErrNoKey},
		{"empty metadata", cdkpubsub.Metadata("empty"), "", adapter.ErrNoKey},
		{"body field", cdkpubsub.BodyField("order", "id"), "9912", nil},
		{"empty body field", cdkpubsub.BodyField("name"), "", adapter.ErrNoKey},
		{"prefixed", cdkpubsub.Prefixed("order-completed:", cdkpubsub.BodyField("order", "id")), "order-completed:9912", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.k(msg)
			if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("(%q, %v), want (%q, %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := cdkpubsub.BodyField("id")(&pubsub.Message{Body: []byte("not json")}); !errors.Is(err, adapter.ErrUndecodable) {
		t.Fatalf("BodyField of a body that is not JSON: %v, want ErrUndecodable", err)
	}
}

func TestTimeMetadata(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 30, 0, 123, time.UTC)
	f := cdkpubsub.TimeMetadata("occurred-at")
	got, err := f(&pubsub.Message{Metadata: map[string]string{"occurred-at": adapter.FormatEventTime(at)}})
	if err != nil || !got.Equal(at) {
		t.Fatalf("(%v, %v), want %v", got, err, at)
	}
	if _, err := f(&pubsub.Message{}); !errors.Is(err, adapter.ErrNoEventTime) {
		t.Fatalf("no metadata: %v, want ErrNoEventTime", err)
	}
	if _, err := cdkpubsub.TimeHeader("occurred-at")(&pubsub.Message{Metadata: map[string]string{"occurred-at": "yesterday"}}); !errors.Is(err, adapter.ErrBadEventTime) {
		t.Fatalf("bad metadata: %v, want ErrBadEventTime", err)
	}
}
