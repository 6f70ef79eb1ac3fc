package deadletter

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// TestDecode reads the dead-letter payloads of kafka, redisstream,
// cdkpubsub, nats and rabbitmq as their DeadLetter types write them, and leaves a payload of
// another shape in Raw only.
func TestDecode(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		want      DeadLetter
	}{
		{"kafka", `{"topic":"in-dlq","source_topic":"in","partition":2,"offset":41,"key":"YWNjdA==","value":"e30=",
			"headers":[{"Key":"idempotency-key","Value":"cC0x"},{"Key":"trace","Value":"dA=="}],"timestamp":"2026-11-30T00:00:00Z","error":"poison"}`,
			DeadLetter{Reason: "poison", Topic: "in", Destination: "in-dlq", Source: "in/2/41", RecordKey: []byte("acct"), Payload: []byte("{}"),
				Headers: []Header{{"idempotency-key", "p-1"}, {"trace", "t"}}}},
		{"redisstream", `{"stream":"s-dead","source_stream":"s","group":"g","id":"1-0","values":{"payload":"{}","key":"k-1"},"error":"bad"}`,
			DeadLetter{Reason: "bad", Topic: "s", Destination: "s-dead", Source: "s/g/1-0", Headers: []Header{{"key", "k-1"}, {"payload", "{}"}}}},
		{"cdkpubsub", `{"body":"aGk=","metadata":{"b":"2","a":"1"},"loggable_id":"m-9","error":"nope"}`,
			DeadLetter{Reason: "nope", Source: "m-9", Payload: []byte("hi"), Headers: []Header{{"a", "1"}, {"b", "2"}}}},
		{"nats", `{"destination":"dlq.orders","source":"orders.created","origin":"ORDERS/loyalty/7","deliveries":3,
			"headers":{"Order-Key":["o-1"],"A":["x","y"]},"body":"e30=","error":"refused"}`,
			DeadLetter{Reason: "refused", Topic: "orders.created", Destination: "dlq.orders", Source: "ORDERS/loyalty/7", Deliveries: 3,
				Payload: []byte("{}"), Headers: []Header{{"A", "x"}, {"A", "y"}, {"Order-Key", "o-1"}}}},
		{"rabbitmq default exchange", `{"destination":"dlx","destination_key":"orders.dead","source":"","source_key":"orders","origin":"orders/4",
			"deliveries":2,"message_id":"o-2","body":"e30=","error":"refused"}`,
			DeadLetter{Reason: "refused", Topic: "orders", Destination: "dlx/orders.dead", Source: "orders/4", Deliveries: 2,
				Payload: []byte("{}"), Headers: []Header{{"message-id", "o-2"}}}},
		{"another shape", `[1, 2]`, DeadLetter{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := DeadLetter{Raw: json.RawMessage(c.raw)}
			d.decode()
			c.want.Raw = d.Raw
			if !reflect.DeepEqual(d, c.want) {
				t.Errorf("decoded\n%+v\nwant\n%+v", d, c.want)
			}
		})
	}
}

// TestFilterCheck: what cannot be right is ErrInvalidFilter, naming it.
func TestFilterCheck(t *testing.T) {
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, f := range []Filter{
		{Limit: -1}, {Limit: MaxPage + 1}, {After: -1}, {From: at, Before: at}, {IDs: []int64{0}}, {Consumer: "a\x00b"}, {Reason: "\xff"},
	} {
		if err := f.Check(); !errors.Is(err, ErrInvalidFilter) {
			t.Errorf("Check(%+v) = %v, want ErrInvalidFilter", f, err)
		}
	}
	if err := (Filter{Topic: "in", From: at, Before: at.Add(time.Hour), IDs: []int64{3}, Limit: MaxPage}).Check(); err != nil {
		t.Errorf("a good filter: %v", err)
	}
	if err := checkActor(" "); !errors.Is(err, ErrInvalidFilter) {
		t.Errorf("a blank actor: %v", err)
	}
}
