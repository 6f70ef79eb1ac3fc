package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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
		{"no message_id", rabbitmq.MessageID(), amqp.Delivery{DeliveryTag: 42}, "", adapter.ErrNoKey},
		{"string header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": "evt-2"}}, "evt-2", nil},
		{"bytes header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": []byte("evt-3")}}, "evt-3", nil},
		{"integer header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": int64(77)}}, "77", nil},
		{"missing header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"other": "x"}}, "", adapter.ErrNoKey},
		{"no headers", rabbitmq.Header("event-id"), amqp.Delivery{}, "", adapter.ErrNoKey},
		{"empty header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": ""}}, "", adapter.ErrNoKey},
		{"float header", rabbitmq.Header("event-id"), amqp.Delivery{Headers: amqp.Table{"event-id": 1.5}}, "", adapter.ErrNoKey},
		{"number field", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: order}, "9912", nil},
		{"nested field", rabbitmq.BodyField("customer", "id"), amqp.Delivery{Body: order}, "c-7", nil},
		{"prefixed", rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id")), amqp.Delivery{Body: order}, "order-completed:9912", nil},
		{"prefixed error", rabbitmq.Prefixed("order-completed:", rabbitmq.MessageID()), amqp.Delivery{}, "", adapter.ErrNoKey},
		{"missing field", rabbitmq.BodyField("event_id"), amqp.Delivery{Body: order}, "", adapter.ErrNoKey},
		{"empty field", rabbitmq.BodyField("note"), amqp.Delivery{Body: order}, "", adapter.ErrNoKey},
		{"array field", rabbitmq.BodyField("tags"), amqp.Delivery{Body: order}, "", adapter.ErrNoKey},
		{"through a non-object", rabbitmq.BodyField("order_id", "x"), amqp.Delivery{Body: order}, "", adapter.ErrNoKey},
		{"null field", rabbitmq.BodyField("id"), amqp.Delivery{Body: []byte(`{"id": null}`)}, "", adapter.ErrNoKey},
		{"not JSON", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`order 9912`)}, "", adapter.ErrUndecodable},
		{"trailing data", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`{"order_id": 1} {}`)}, "", adapter.ErrUndecodable},
		{"array body", rabbitmq.BodyField("order_id"), amqp.Delivery{Body: []byte(`[1]`)}, "", adapter.ErrUndecodable},
		{"empty body", rabbitmq.BodyField("order_id"), amqp.Delivery{}, "", adapter.ErrUndecodable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.key(&tc.d)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != "" {
					t.Fatalf("got (%q, %v), want an error matching %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tc.want)
			}
		})
	}
}

type orderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
}

// TestKeysOfAConsumer: WithKey replaces the default message_id, and a
// failing key function makes the delivery poison before any transaction.
func TestKeysOfAConsumer(t *testing.T) {
	t.Parallel()
	failing := func(*amqp.Delivery) (string, error) { return "", errors.New("lookup failed") }
	for _, tc := range []struct {
		name string
		key  rabbitmq.KeyFunc
		d    amqp.Delivery
		want string
		err  error
	}{
		{"default", nil, amqp.Delivery{MessageId: "evt-1", Body: []byte(`{"order_id": 9912}`)}, "evt-1", nil},
		{"body field", rabbitmq.Prefixed("order-completed:", rabbitmq.BodyField("order_id")), amqp.Delivery{MessageId: "evt-1", Body: []byte(`{"order_id": 9912}`)}, "order-completed:9912", nil},
		{"failing key function", failing, amqp.Delivery{MessageId: "evt-1"}, "", errors.New("lookup failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mw, db := newMiddleware(t)
			var opts []rabbitmq.Option
			if tc.key != nil {
				opts = append(opts, rabbitmq.WithKey(tc.key))
			}
			e := settleOne(t, mw, effect, tc.d, opts...)
			if tc.err != nil {
				if e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, idempotent.ErrInvalidKey) || !strings.Contains(e.Err.Error(), "key function: lookup failed") {
					t.Fatalf("settled %v (%v), want dead-lettered naming the key function's error", e.Type, e.Err)
				}
				return
			}
			if e.Type != adapter.EventApplied || e.Message.Key != tc.want || !db.claimed(tc.want) {
				t.Fatalf("settled %v with key %q (%v), want applied with %q", e.Type, e.Message.Key, e.Err, tc.want)
			}
		})
	}
}

// TestDecode: the body is decoded in the claim's transaction, and a body
// that cannot be decoded rolls it back and is dead-lettered.
func TestDecode(t *testing.T) {
	t.Parallel()
	var got []orderCompleted
	h := rabbitmq.Decode(rabbitmq.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, d *amqp.Delivery) error {
		got = append(got, o)
		return effect(ctx, tx, d)
	})
	mw, db := newMiddleware(t)
	if e := settleOne(t, mw, h, amqp.Delivery{MessageId: "a", Body: []byte(`{"order_id": 1, "customer_id": 7, "new_field": true}`)}); e.Type != adapter.EventApplied {
		t.Fatalf("a JSON body: %v (%v), want applied", e.Type, e.Err)
	}
	if len(got) != 1 || got[0] != (orderCompleted{OrderID: 1, CustomerID: 7}) {
		t.Fatalf("decoded %+v", got)
	}
	for name, body := range map[string]string{"not JSON": "order 2", "a wrong type": `{"order_id": "two"}`, "trailing data": `{"order_id": 2} {}`} {
		e := settleOne(t, mw, h, amqp.Delivery{MessageId: "b", Body: []byte(body)})
		if e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, adapter.ErrUndecodable) {
			t.Fatalf("%s: %v (%v), want dead-lettered with ErrUndecodable", name, e.Type, e.Err)
		}
	}
	own := rabbitmq.Decode(func([]byte) (orderCompleted, error) {
		return orderCompleted{}, errors.New("unsupported schema version")
	},
		func(context.Context, *sql.Tx, orderCompleted, *amqp.Delivery) error { return nil })
	if e := settleOne(t, mw, own, amqp.Delivery{MessageId: "c"}); e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, adapter.ErrUndecodable) {
		t.Fatalf("own decoder: %v (%v), want dead-lettered with ErrUndecodable", e.Type, e.Err)
	}
	if db.claimed("b") || db.claimed("c") || len(db.committed()) != 1 {
		t.Fatalf("the undecodable deliveries left claims or effects: %q", db.committed())
	}
}
