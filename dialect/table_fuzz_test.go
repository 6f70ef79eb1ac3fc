package dialect

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// identRule is the documented identifier rule, written out independently
// of CheckIdentifier.
var identRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func identOK(s string) bool { return len(s) <= MaxIdentifierBytes && identRule.MatchString(s) }

// FuzzParseTable checks ParseTable against the documented rule: it accepts
// "name" or "schema.name" of plain identifiers and nothing else; what it
// accepts round-trips through String and quotes to exactly its parts; what
// it rejects gets an error matching ErrInvalidIdentifier that quotes the
// input.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{
		"processed_messages", "app.processed_messages", "_", "A1", "", ".", "a.", ".a", "a.b.c",
		"1a", "a-b", "a b", `a"b`, "a;b", "a'b", "a\x00b", "ä", "select", "SELECT.from",
		strings.Repeat("x", MaxIdentifierBytes), strings.Repeat("x", MaxIdentifierBytes+1),
		`x"; DROP TABLE y; --`, "a.b\n", "\ta",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts := strings.Split(s, ".")
		want := len(parts) <= 2
		for _, p := range parts {
			want = want && identOK(p)
		}
		tb, err := ParseTable(s)
		if (err == nil) != want {
			t.Fatalf("ParseTable(%q) = %+v, %v; the documented rule says valid=%v", s, tb, err, want)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidIdentifier) {
				t.Fatalf("ParseTable(%q): error %v does not match ErrInvalidIdentifier", s, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
				t.Fatalf("ParseTable(%q): error %q does not quote the input", s, err)
			}
			if tb != (Table{}) {
				t.Fatalf("ParseTable(%q) failed but returned %+v", s, tb)
			}
			return
		}
		if tb.String() != s {
			t.Fatalf("ParseTable(%q).String() = %q", s, tb.String())
		}
		if !identOK(tb.Name) || (tb.Schema != "" && !identOK(tb.Schema)) {
			t.Fatalf("ParseTable(%q) = %+v: a part is not an identifier", s, tb)
		}
		bracket := func(p string) string { return "[" + p + "]" }
		wantQ := "[" + strings.Join(parts, "].[") + "]"
		if got := tb.Quoted(bracket); got != wantQ {
			t.Fatalf("ParseTable(%q).Quoted = %q, want %q", s, got, wantQ)
		}
	})
}

// FuzzCheckIdentifier checks CheckIdentifier against the documented rule
// and that a rejection matches ErrInvalidIdentifier and explains itself.
func FuzzCheckIdentifier(f *testing.F) {
	for _, s := range []string{"a", "_1", "", "1", "a.b", "a\"", "é", strings.Repeat("y", MaxIdentifierBytes+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := CheckIdentifier(s)
		if (err == nil) != identOK(s) {
			t.Fatalf("CheckIdentifier(%q) = %v; the documented rule says valid=%v", s, err, identOK(s))
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidIdentifier) {
				t.Fatalf("CheckIdentifier(%q): %v does not match ErrInvalidIdentifier", s, err)
			}
			if len(err.Error()) <= len(ErrInvalidIdentifier.Error()) {
				t.Fatalf("CheckIdentifier(%q): error %q does not name the problem", s, err)
			}
		}
	})
}
