package adapter_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

func TestBodyFieldKey(t *testing.T) {
	cases := []struct {
		data, path, want string
		err              error
		says             string
	}{
		{`{"id":"o-1"}`, "id", "o-1", nil, ""},
		{`{"order":{"id":9912}}`, "order.id", "9912", nil, ""},
		{`{"id":12345678901234567890}`, "id", "12345678901234567890", nil, ""},
		{`not json`, "id", "", adapter.ErrUndecodable, `reading key field "id"`},
		{`{"id":"a"} {}`, "id", "", adapter.ErrUndecodable, "data after the JSON value"},
		{`[1,2]`, "id", "", adapter.ErrUndecodable, "the body is a JSON array, not an object"},
		{`{"order":"x"}`, "order.id", "", adapter.ErrNoKey, `field "order" is a JSON string, not an object`},
		{`{"other":1}`, "id", "", adapter.ErrNoKey, `no field "id" in the body`},
		{`{"id":""}`, "id", "", adapter.ErrNoKey, `field "id" is empty`},
		{`{"id":null}`, "id", "", adapter.ErrNoKey, "a JSON null, want a string or a number"},
		{`{"id":true}`, "id", "", adapter.ErrNoKey, "a JSON boolean, want a string or a number"},
	}
	for _, c := range cases {
		key := adapter.BodyFieldKey("body", func(b []byte) []byte { return b }, strings.Split(c.path, ".")...)
		got, err := key([]byte(c.data))
		if c.err == nil {
			if err != nil || got != c.want {
				t.Errorf("Field(%s, %s) = (%q, %v), want %q", c.data, c.path, got, err, c.want)
			}
			continue
		}
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.says) || got != "" {
			t.Errorf("Field(%s, %s) = (%q, %v), want an error matching %v that says %q", c.data, c.path, got, err, c.err, c.says)
		}
	}
}

func TestKeyErrorsArePoison(t *testing.T) {
	if !adapter.IsPoison(adapter.ErrUndecodable) {
		t.Error("ErrUndecodable does not match ErrPoison")
	}
	if !errors.Is(adapter.ErrNoKey, idempotent.ErrInvalidKey) {
		t.Error("ErrNoKey does not match idempotent.ErrInvalidKey")
	}
}

func TestHeaderKeyAndPrefixed(t *testing.T) {
	headers := map[string]string{"id": "9912", "empty": ""}
	get := func(h map[string]string, name string) (string, bool) { v, ok := h[name]; return v, ok }
	k := adapter.Prefixed("order:", adapter.HeaderKey("id", get))
	if got, err := k(headers); err != nil || got != "order:9912" {
		t.Errorf("Prefixed(HeaderKey(id)) = (%q, %v), want order:9912", got, err)
	}
	for _, name := range []string{"empty", "missing"} {
		if got, err := adapter.HeaderKey(name, get)(headers); !errors.Is(err, adapter.ErrNoKey) || got != "" {
			t.Errorf("HeaderKey(%s) = (%q, %v), want ErrNoKey", name, got, err)
		}
	}
	if _, err := adapter.JSONField([]byte(`{"a":{"b":7}}`), "a", "b"); err != nil {
		t.Errorf("JSONField: %v", err)
	}
}
