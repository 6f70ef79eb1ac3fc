package jsonkey

import (
	"errors"
	"strings"
	"testing"
)

var (
	errUndecodable = errors.New("undecodable")
	errNoKey       = errors.New("no key")
)

func TestField(t *testing.T) {
	cases := []struct {
		data, path, want string
		err              error
		says             string
	}{
		{`{"id":"o-1"}`, "id", "o-1", nil, ""},
		{`{"order":{"id":9912}}`, "order.id", "9912", nil, ""},
		{`{"id":12345678901234567890}`, "id", "12345678901234567890", nil, ""},
		{`not json`, "id", "", errUndecodable, `reading key field "id"`},
		{`{"id":"a"} {}`, "id", "", errUndecodable, "data after the JSON value"},
		{`[1,2]`, "id", "", errUndecodable, "the body is a JSON array, not an object"},
		{`{"order":"x"}`, "order.id", "", errNoKey, `field "order" is a JSON string, not an object`},
		{`{"other":1}`, "id", "", errNoKey, `no field "id" in the body`},
		{`{"id":""}`, "id", "", errNoKey, `field "id" is empty`},
		{`{"id":null}`, "id", "", errNoKey, "a JSON null, want a string or a number"},
		{`{"id":true}`, "id", "", errNoKey, "a JSON boolean, want a string or a number"},
	}
	for _, c := range cases {
		got, err := Field([]byte(c.data), strings.Split(c.path, "."), "body", errUndecodable, errNoKey)
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
