package watermill_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
	idwm "github.com/txclaim/idempotent/watermill"
)

func TestKeyFuncs(t *testing.T) {
	t.Parallel()
	msg := func(uuid, payload string, md map[string]string) *message.Message {
		m := message.NewMessage(uuid, []byte(payload))
		for k, v := range md {
			m.Metadata.Set(k, v)
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		k       idwm.KeyFunc
		msg     *message.Message
		want    string
		wantErr error
	}{
		{"UUID", idwm.UUID(), msg("order-completed:9912", "{}", nil), "order-completed:9912", nil},
		{"UUID empty", idwm.UUID(), msg("", "{}", nil), "", adapter.ErrNoKey},
		{"Header", idwm.Header(idwm.KeyMetadata), msg("u", "{}", map[string]string{idwm.KeyMetadata: "k-1"}), "k-1", nil},
		{"Header missing", idwm.Header(idwm.KeyMetadata), msg("u", "{}", nil), "", adapter.ErrNoKey},
		{"Header empty", idwm.Header(idwm.KeyMetadata), msg("u", "{}", map[string]string{idwm.KeyMetadata: ""}), "", adapter.ErrNoKey},
		{"BodyField", idwm.BodyField("order", "id"), msg("u", `{"order": {"id": "9912"}}`, nil), "9912", nil},
		{"BodyField missing", idwm.BodyField("order", "id"), msg("u", `{"order": {}}`, nil), "", adapter.ErrNoKey},
		{"BodyField not JSON", idwm.BodyField("id"), msg("u", `id=1`, nil), "", adapter.ErrUndecodable},
		{"Prefixed", idwm.Prefixed("order-completed:", idwm.BodyField("id")), msg("u", `{"id": 7}`, nil), "order-completed:7", nil},
		{"Prefixed error", idwm.Prefixed("order-completed:", idwm.BodyField("id")), msg("u", `{}`, nil), "", adapter.ErrNoKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.k(tc.msg)
			if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("key %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestTimeHeader(t *testing.T) {
	t.Parallel()
	f := idwm.TimeHeader("occurred_at")
	m := message.NewMessage("u", nil)
	if at, err := f(m); err != nil || !at.IsZero() {
		t.Fatalf("missing field: %v, %v; want the zero time", at, err)
	}
	m.Metadata.Set("occurred_at", "2031-03-15T12:00:00Z")
	if at, err := f(m); err != nil || at.Format("2006-01-02T15:04:05Z07:00") != "2031-03-15T12:00:00Z" {
		t.Fatalf("RFC 3339 field: %v, %v", at, err)
	}
	m.Metadata.Set("occurred_at", "1773576000")
	if _, err := f(m); !errors.Is(err, adapter.ErrBadEventTime) {
		t.Fatalf("seconds: %v, want adapter.ErrBadEventTime", err)
	}
}
