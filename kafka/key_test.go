package kafka_test

import (
	"errors"
	"strings"
	"testing"
	"time"

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
		{"missing header", kafka.Header(kafka.DefaultKeyHeader), rec("", "other", "x"), "", adapter.ErrNoKey},
		{"empty header", kafka.Header("k"), rec("", "k", ""), "", adapter.ErrNoKey},
		{"cloudevents id", kafka.CloudEventsID(), rec("", "ce_id", "evt-9"), "evt-9", nil},
		{"body field", kafka.BodyField("order", "id"), rec(`{"order":{"id":9912}}`), "9912", nil},
		{"body string field", kafka.BodyField("id"), rec(`{"id":"a"}`), "a", nil},
		{"body missing field", kafka.BodyField("id"), rec(`{"x":1}`), "", adapter.ErrNoKey},
		{"body not json", kafka.BodyField("id"), rec(`nope`), "", adapter.ErrUndecodable},
		{"body not an object", kafka.BodyField("id"), rec(`[1]`), "", adapter.ErrUndecodable},
		{"prefixed", kafka.Prefixed("pay:", kafka.Header("k")), rec("", "k", "1"), "pay:1", nil},
		{"prefixed error", kafka.Prefixed("pay:", kafka.Header("k")), rec(""), "", adapter.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.key(tt.rec)
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && (adapter.Rule{}).Settle(idempotent.Message{}, err, 1).Action != adapter.DeadLetter {
				t.Errorf("%v is not poison", err)
			}
		})
	}
}

func TestTimeHeader(t *testing.T) {
	rec := func(v ...string) *kgo.Record {
		r := &kgo.Record{}
		for _, x := range v {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "at", Value: []byte(x)})
		}
		return r
	}
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		rec  *kgo.Record
		want time.Time
		err  error
	}{
		{"RFC 3339", rec("2026-12-01T10:30:00+01:00"), at, nil},
		{"the first of several", rec("2026-12-01T09:30:00Z", "2027-01-01T00:00:00Z"), at, nil},
		{"missing", rec(), time.Time{}, adapter.ErrNoEventTime},
		{"empty", rec(" "), time.Time{}, adapter.ErrNoEventTime},
		{"epoch seconds", rec("1764581400"), time.Time{}, adapter.ErrBadEventTime},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := kafka.TimeHeader("at")(c.rec)
			if !errors.Is(err, c.err) || !got.Equal(c.want) {
				t.Fatalf("TimeHeader = (%v, %v), want (%v, %v)", got, err, c.want, c.err)
			}
			if err != nil && (adapter.Rule{}).Settle(idempotent.Message{}, err, 1).Action != adapter.DeadLetter {
				t.Errorf("%v is not poison", err)
			}
		})
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
