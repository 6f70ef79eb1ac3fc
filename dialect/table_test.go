package dialect_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
)

func TestParseTable(t *testing.T) {
	long := strings.Repeat("t", dialect.MaxIdentifierBytes)
	ok := []struct {
		in   string
		want dialect.Table
	}{
		{"processed_messages", dialect.Table{Name: "processed_messages"}},
		{"app.processed_messages", dialect.Table{Schema: "app", Name: "processed_messages"}},
		{"_t", dialect.Table{Name: "_t"}},
		{"t1", dialect.Table{Name: "t1"}},
		{"select", dialect.Table{Name: "select"}},
		{long, dialect.Table{Name: long}},
		{long + "." + long, dialect.Table{Schema: long, Name: long}},
	}
	for _, c := range ok {
		got, err := dialect.ParseTable(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseTable(%q) = (%+v, %v), want %+v", c.in, got, err, c.want)
			continue
		}
		if got.String() != c.in {
			t.Errorf("ParseTable(%q).String() = %q", c.in, got.String())
		}
	}

	bad := []struct{ in, says string }{
		{"", "empty"},
		{".", "empty"},
		{"app.", "empty"},
		{".t", "empty"},
		{"a.b.c", "at most one dot"},
		{"a..b", "at most one dot"},
		{"x; DROP TABLE y", `';' at byte 1`},
		{`"quoted"`, `'"' at byte 0`},
		{`x"; DROP TABLE y; --`, `'"' at byte 1`},
		{"1abc", "'1' at byte 0"},
		{"a-b", "'-' at byte 1"},
		{"tbl name", "' ' at byte 3"},
		{"ümlaut", "at byte 0"},
		{"t\x00", `'\x00' at byte 1`},
		{"t'", `'\'' at byte 1`},
		{"t*/", "'*' at byte 1"},
		{"app.1t", "'1' at byte 0"},
		{long + "x", "64 bytes, the limit is 63"},
		{"app." + long + "x", "64 bytes, the limit is 63"},
		{"T1", "upper-case"},
		{"Processed_X", `"Processed_X": invalid identifier: it has upper-case letters: Postgres folds unquoted names to lower case, so a table created by hand as Processed_X is processed_x`},
		{"Processed_X", "; use processed_x"},
		{"App.claims", "use app.claims"},
		{"app.Claims", "use app.claims"},
		{"SELECT", "use select"},
	}
	for _, c := range bad {
		got, err := dialect.ParseTable(c.in)
		if !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("ParseTable(%q) = (%+v, %v), want ErrInvalidIdentifier", c.in, got, err)
			continue
		}
		if got != (dialect.Table{}) {
			t.Errorf("ParseTable(%q) returned %+v with its error", c.in, got)
		}
		if !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "table name") {
			t.Errorf("ParseTable(%q): %q does not say %q", c.in, err, c.says)
		}
	}
}

func TestCheckIdentifier(t *testing.T) {
	for _, s := range []string{"a", "_", "_1", "abc_DEF_123", strings.Repeat("x", dialect.MaxIdentifierBytes)} {
		if err := dialect.CheckIdentifier(s); err != nil {
			t.Errorf("CheckIdentifier(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "1", "a.b", "a b", "a$", "é", "a\x00", strings.Repeat("x", dialect.MaxIdentifierBytes+1)} {
		if err := dialect.CheckIdentifier(s); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("CheckIdentifier(%q) = %v, want ErrInvalidIdentifier", s, err)
		}
	}
}

func TestTableQuoted(t *testing.T) {
	q := func(s string) string { return "[" + s + "]" }
	if got := (dialect.Table{Name: "t"}).Quoted(q); got != "[t]" {
		t.Errorf("Quoted = %q", got)
	}
	if got := (dialect.Table{Schema: "s", Name: "t"}).Quoted(q); got != "[s].[t]" {
		t.Errorf("Quoted = %q", got)
	}
}
