package dialect

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// identRule is the documented identifier rule, written out independently
// of CheckIdentifier; tableRule is a table name part's, which also refuses
// upper-case letters.
var (
	identRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	tableRule = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

func identOK(s string) bool { return len(s) <= MaxIdentifierBytes && identRule.MatchString(s) }

func tablePartOK(s string) bool { return len(s) <= MaxIdentifierBytes && tableRule.MatchString(s) }

// FuzzParseTable checks ParseTable against the documented rule: it accepts
// "name" or "schema.name" of plain lower-case identifiers and nothing else;
// what it accepts round-trips through String and quotes to exactly its
// parts; what it rejects gets an error matching ErrInvalidIdentifier that
// quotes the input, and a name refused only for its upper-case letters gets
// one that says so and gives the lower-case name.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{
		"processed_messages", "app.processed_messages", "_", "A1", "", ".", "a.", ".a", "a.b.c",
		"1a", "a-b", "a b", `a"b`, "a;b", "a'b", "a\x00b", "ä", "select", "SELECT.from",
		"Processed_X", "app.Claims", "App.claims", "T1", "_Ä",
		strings.Repeat("x", MaxIdentifierBytes), strings.Repeat("x", MaxIdentifierBytes+1),
		`x"; DROP TABLE y; --`, "a.b\n", "\ta",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts := strings.Split(s, ".")
		want, caseOnly := len(parts) <= 2, len(parts) <= 2
		for _, p := range parts {
			want = want && tablePartOK(p)
			caseOnly = caseOnly && identOK(p)
		}
		caseOnly = caseOnly && !want
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
			if caseOnly && (!strings.Contains(err.Error(), "upper-case letters") || !strings.HasSuffix(err.Error(), "; use "+strings.ToLower(s))) {
				t.Fatalf("ParseTable(%q): error %q does not say the name has upper-case letters and give the lower-case one", s, err)
			}
			return
		}
		if tb.String() != s {
			t.Fatalf("ParseTable(%q).String() = %q", s, tb.String())
		}
		if !tablePartOK(tb.Name) || (tb.Schema != "" && !tablePartOK(tb.Schema)) {
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
