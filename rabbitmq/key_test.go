package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	_ "github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

func TestKeyFuncs(t *testing.T) {
	t.Parallel()
	order := []byte(`{"order_id": 9912, "customer": {"id": "c-7"}, "note": "", "total": 50.5, "tags": []}`)
	cases := []struct {
		name    string
		key     rabbitmq.KeyFunc
		d       amqp.Delivery
		want    string
		wantErr error
	}{
		{"message_id", rabbitmq.MessageID(), amqp.Delivery{MessageId: "evt-1", DeliveryTag: 42}, "evt-1", nil},
		{"no message_id", rabbitmq.MessageID(), amqp.Delivery{DeliveryTag: 42}, "", rabbitmq.ErrNoKey},
		{"string header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": "evt-2"}}, "evt-2", nil},
		{"bytes header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": []byte("evt-3")}}, "evt-3", nil},
		{"integer header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": int64(77)}}, "77", nil},
		{"missing header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"other": "x"}}, "", rabbitmq.ErrNoKey},
		{"no headers", rabbitmq.Header("event-id"), amqp.Delivery{}, "", rabbitmq.ErrNoKey},
		{"empty header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": ""}}, "", rabbitmq.ErrNoKey},
		{"float header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": 1.5}}, "", rabbitmq.ErrNoKey},
		{"number field", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: order}, "9912", nil},
		{"nested field", rabbitmq.BodyField("customer", "id"), amqp.Delivery{Body: order}, "c-7", nil},
		{"prefixed", rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id")), amqp.Delivery{Body: order}, "order-completed:9912", nil},
		{"prefixed error", rabbitmq.Prefixed("order-completed:", rabbitmq.MessageID()), amqp.Delivery{}, "", rabbitmq.ErrNoKey},
		{"missing field", rabbitmq.BodyField("event_id"), amqp.Delivery{Body: order}, "", rabbitmq.ErrNoKey},
		{"empty field", rabbitmq.BodyField("note"), amqp.Delivery{Body: order}, "", rabbitmq.ErrNoKey},
		{"array field", rabbitmq.BodyField("tags"), amqp.Delivery{Body: order}, "", rabbitmq.ErrNoKey},
		{"through a non-object", rabbitmq.BodyField("order_id", "x"), amqp.Delivery{Body: order}, "", rabbitmq.ErrNoKey},
		{"null field", rabbitmq.BodyField("id"), amqp.Delivery{Body: []byte(`{"id": null}`)}, "", rabbitmq.ErrNoKey},
		{"not JSON", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`order 9912`)}, "", rabbitmq.ErrUndecodable},
		{"trailing data", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`{"order_id": 1} {}`)}, "", rabbitmq.ErrUndecodable},
		{"array body", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`[1]`)}, "", rabbitmq.ErrUndecodable},
		{"empty body", rabbitmq.BodyField("order_id"), amqp.Delivery{}, "", rabbitmq.ErrUndecodable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.key(&tc.d)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != "" {
					t.Fatalf("got (%q, %v), want an error matching %v", got, err, tc.wantErr)
				}
				if !rabbitmq.IsPoison(err) {
					t.Fatalf("%v is not poison", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestPoison(t *testing.T) {
	t.Parallel()
	base := errors.New("unknown customer 7")
	p := rabbitmq.Poison(base)
	if !errors.Is(p, rabbitmq.ErrPoison) || !errors.Is(p, base) || !rabbitmq.IsPoison(p) {
		t.Fatalf("Poison(%v) = %v: does not match both ErrPoison and the cause", base, p)
	}
	if rabbitmq.Poison(nil) != nil {
		t.Fatal("Poison(nil) is not nil")
	}
	if !errors.Is(rabbitmq.ErrNoKey, idempotent.ErrInvalidKey) || !errors.Is(rabbitmq.ErrUndecodable, rabbitmq.ErrPoison) {
		t.Fatal("ErrNoKey or ErrUndecodable is not poison")
	}
	if rabbitmq.IsPoison(base) || rabbitmq.IsPoison(idempotent.ErrClaimBusy) || rabbitmq.IsPoison(nil) {
		t.Fatal("an ordinary error is poison")
	}
}

// unreachableMiddleware returns a Middleware whose database refuses every
// connection: a handler that reaches it fails with an error that is not
// poison.
func unreachableMiddleware(t *testing.T) *idempotent.Middleware {
	t.Helper()
	db, err := sql.Open("postgres", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

type orderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
}

func TestHandlersRejectPoisonBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	mw := unreachableMiddleware(t)
	ran := false
	fn := func(context.Context, *sql.Tx, *amqp.Delivery) error { ran = true; return nil }
	h := func(context.Context, *sql.Tx, orderCompleted) error { ran = true; return nil }
	failingKey := func(*amqp.Delivery) (string, error) { return "", errors.New("lookup failed") }
	cases := []struct {
		name    string
		handler rabbitmq.Handler
		d       amqp.Delivery
		want    error
	}{
		{"Process, no key", must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), fn)), amqp.Delivery{Body: []byte(`{}`)}, rabbitmq.ErrNoKey},
		{"Process, key with NUL", must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), fn)), amqp.Delivery{MessageId: "a\x00b"}, idempotent.ErrInvalidKey},
		{"Process, failing key function", must(t)(rabbitmq.Process(mw, failingKey, fn)), amqp.Delivery{MessageId: "m"}, idempotent.ErrInvalidKey},
		{"Decode, no key", must(t)(rabbitmq.Decode(mw, rabbitmq.MessageID(), rabbitmq.JSON[orderCompleted], h)), amqp.Delivery{Body: []byte(`{}`)}, rabbitmq.ErrNoKey},
		{"Decode, bad JSON", must(t)(rabbitmq.Decode(mw, rabbitmq.MessageID(), rabbitmq.JSON[orderCompleted], h)), amqp.Delivery{MessageId: "m", Body: []byte(`{"order_id": "x"}`)}, rabbitmq.ErrUndecodable},
		{"Decode, own decoder", must(t)(rabbitmq.Decode(mw, rabbitmq.MessageID(), func([]byte) (orderCompleted, error) {
			return orderCompleted{}, errors.New("unsupported schema version")
		}, h)), amqp.Delivery{MessageId: "m"}, rabbitmq.ErrUndecodable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.handler(context.Background(), &tc.d)
			if !errors.Is(err, tc.want) || !rabbitmq.IsPoison(err) || out != 0 {
				t.Fatalf("got (%v, %v), want a poison error matching %v", out, err, tc.want)
			}
		})
	}
	if ran {
		t.Fatal("a handler ran for a poison delivery")
	}
	// A valid delivery does reach the database, and that failure is not poison.
	_, err := must(t)(rabbitmq.Process(mw, rabbitmq.MessageID(), fn))(context.Background(), &amqp.Delivery{MessageId: "m"})
	if err == nil || rabbitmq.IsPoison(err) {
		t.Fatalf("unreachable database: %v, want an error that is not poison", err)
	}
}
