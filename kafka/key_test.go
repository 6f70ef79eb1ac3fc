package kafka_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
)

func TestKeyFuncs(t *testing.T) {
	rec := func(value string, headers ...string) *kgo.Record {
		r := &kgo.Record{Topic: "t", Partition: 1, Offset: 7, Value: []byte(value)}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return r
	}
	tests := []struct {
		name    string
		key     kafka.KeyFunc
		rec     *kgo.Record
		want    string
		wantErr error
	}{
		{"header", kafka.Header(kafka.DefaultKeyHeader), rec("", "idempotency-key", "order:1"), "order:1", nil},
		{"first header of several", kafka.Header("k"), rec("", "k", "a", "k", "b"), "a", nil},
		{"missing header", kafka.Header(kafka.DefaultKeyHeader), rec("", "other", "x"), "", kafka.ErrNoKey},
		{"empty header", kafka.Header("k"), rec("", "k", ""), "", kafka.ErrNoKey},
		{"cloudevents id", kafka.CloudEventsID(), rec("", "ce_id", "evt-9"), "evt-9", nil},
		{"body field", kafka.BodyField("order", "id"), rec(`{"order":{"id":9912}}`), "9912", nil},
		{"body string field", kafka.BodyField("id"), rec(`{"id":"a"}`), "a", nil},
		{"body missing field", kafka.BodyField("id"), rec(`{"x":1}`), "", kafka.ErrNoKey},
		{"body not json", kafka.BodyField("id"), rec(`nope`), "", kafka.ErrUndecodable},
		{"body not an object", kafka.BodyField("id"), rec(`[1]`), "", kafka.ErrUndecodable},
		{"prefixed", kafka.Prefixed("pay:", kafka.Header("k")), rec("", "k", "1"), "pay:1", nil},
		{"prefixed error", kafka.Prefixed("pay:", kafka.Header("k")), rec(""), "", kafka.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.key(tt.rec)
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !kafka.IsPoison(err) && (adapter.Rule{}).Settle(idempotent.Message{}, err, 1).Action != adapter.DeadLetter {
				t.Errorf("%v is not poison", err)
			}
		})
	}
}

func TestPoison(t *testing.T) {
	base := errors.New("no such customer")
	if err := kafka.Poison(base); !errors.Is(err, kafka.ErrPoison) || !errors.Is(err, base) || !kafka.IsPoison(err) {
		t.Errorf("Poison(%v) = %v", base, err)
	}
	if kafka.Poison(nil) != nil {
		t.Error("Poison(nil) != nil")
	}
	r := &kgo.Record{Topic: "t", Offset: 3}
	err := kafka.PoisonRecord(r, base)
	var re *kafka.RecordError
	if !errors.As(err, &re) || re.Record != r || !kafka.IsPoison(err) {
		t.Errorf("PoisonRecord = %v", err)
	}
	for _, err := range []error{kafka.ErrUndecodable, kafka.Poison(base)} {
		if !kafka.IsPoison(err) {
			t.Errorf("IsPoison(%v) = false", err)
		}
	}
	// The Middleware's errors are the settle rule's to decide, not IsPoison's.
	for _, err := range []error{base, kafka.ErrFenced, idempotent.ErrClaimBusy, kafka.ErrNoKey, idempotent.ErrBeyondRetention, idempotent.ErrInvalidKey} {
		if kafka.IsPoison(err) {
			t.Errorf("IsPoison(%v) = true", err)
		}
	}
}

func TestSchemaSQL(t *testing.T) {
	up, down, err := kafka.SchemaSQL("app.kafka_offsets")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(up, `CREATE TABLE IF NOT EXISTS "app"."kafka_offsets"`) || !strings.Contains(up, "PRIMARY KEY (consumer, topic, partition)") {
		t.Errorf("up:\n%s", up)
	}
	if down != "DROP TABLE IF EXISTS \"app\".\"kafka_offsets\";\n" {
		t.Errorf("down: %q", down)
	}
	if _, _, err := kafka.SchemaSQL(`x"; DROP TABLE y`); err == nil {
		t.Error("SchemaSQL accepted a table name with a quote")
	}
}
