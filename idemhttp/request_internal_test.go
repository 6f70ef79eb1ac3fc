package idemhttp

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string // "" means an error
	}{
		{[]string{"abc"}, "abc"},
		{[]string{"  abc  "}, "abc"},
		{[]string{"\t abc\t "}, "abc"},
		{[]string{" \t\"abc\"\t "}, "abc"},
		{[]string{"a b"}, "a b"},
		// Only SP and HTAB are OWS: every other byte is the key's.
		{[]string{"abc\u00a0"}, "abc\u00a0"},
		{[]string{"\u2003abc"}, "\u2003abc"},
		{[]string{"abc\u3000"}, "abc\u3000"},
		{[]string{"abc\u0085"}, "abc\u0085"},
		{[]string{"\u00a0"}, "\u00a0"},
		{[]string{"abc\v"}, "abc\v"},
		{[]string{" \t "}, ""},
		{[]string{"\"abc\"\u00a0"}, ""},
		{[]string{`"abc"`}, "abc"},
		{[]string{`"a\"b\\c"`}, `a"b\c`},
		{[]string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{[]string{""}, ""},
		{[]string{`""`}, ""},
		{[]string{`"abc`}, ""},
		{[]string{`"a"b"`}, ""},
		{[]string{`"a\b"`}, ""},
		{[]string{"\"a\tb\""}, ""},
		{[]string{"\"caf\u00e9\""}, ""}, // sf-strings are ASCII
		{[]string{"a", "b"}, ""},
	} {
		got, err := parseKey(c.in)
		if (err == nil) != (c.want != "") || got != c.want {
			t.Errorf("parseKey(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestClaimKeyFraming(t *testing.T) {
	if claimKey("a", "b:c") == claimKey("a:b", "c") {
		t.Error("scope a key b:c and scope a:b key c share a claim key")
	}
	if claimKey("", "k") == claimKey("k", "") {
		t.Error("empty scope and empty key collide")
	}
}

func TestFingerprintParts(t *testing.T) {
	fp := func(method, target, ctype, body string) []byte {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		return fingerprint(r, []string{"Content-Type"}, []byte(body))
	}
	base := fp("POST", "/a", "application/json", "{}")
	if !bytes.Equal(base, fp("POST", "/a", "application/json", "{}")) {
		t.Fatal("the same request has two fingerprints")
	}
	for name, other := range map[string][]byte{
		"method":       fp("PATCH", "/a", "application/json", "{}"),
		"path":         fp("POST", "/b", "application/json", "{}"),
		"query":        fp("POST", "/a?x=1", "application/json", "{}"),
		"content type": fp("POST", "/a", "text/plain", "{}"),
		"no header":    fp("POST", "/a", "", "{}"),
		"body":         fp("POST", "/a", "application/json", "{ }"),
	} {
		if bytes.Equal(base, other) {
			t.Errorf("a different %s has the same fingerprint", name)
		}
	}
}
