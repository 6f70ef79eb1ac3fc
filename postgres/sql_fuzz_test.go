package postgres_test

import (
	"github.com/lib/pq"

	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// scanSQL reads a statement the way Postgres's lexer would for the parts
// that matter here and returns its double-quoted identifiers. It fails on
// anything that could end the statement or hide text from the reader: a
// semicolon, a comment, a string literal, a dollar quote, a backslash, a
// NUL, an unterminated identifier, or an identifier holding a doubled
// quote. Parameters ($1, $2) are allowed.
func scanSQL(sql string) ([]string, error) {
	var idents []string
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '"':
			end := strings.IndexByte(sql[i+1:], '"')
			if end < 0 {
				return nil, fmt.Errorf("unterminated quoted identifier at %d", i)
			}
			if i+1+end+1 < len(sql) && sql[i+1+end+1] == '"' {
				return nil, fmt.Errorf("doubled quote inside an identifier at %d", i+1+end)
			}
			idents = append(idents, sql[i+1:i+1+end])
			i += end + 1
		case c == ';':
			return nil, fmt.Errorf("semicolon at %d", i)
		case c == '\'':
			return nil, fmt.Errorf("string literal at %d", i)
		case c == '\\' || c == 0:
			return nil, fmt.Errorf("byte %q at %d", c, i)
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-', c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			return nil, fmt.Errorf("comment at %d", i)
		case c == '$':
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			if j == i+1 {
				return nil, fmt.Errorf("dollar quote at %d", i)
			}
			i = j - 1
		}
	}
	return idents, nil
}

// quoteParts is the quoting the dialect must apply, written out by hand:
// a parsed identifier holds no double quote, so quoting is wrapping.
func quoteParts(t dialect.Table) string {
	if t.Schema == "" {
		return `"` + t.Name + `"`
	}
	return `"` + t.Schema + `"."` + t.Name + `"`
}

func parts(t dialect.Table) []string {
	if t.Schema == "" {
		return []string{t.Name}
	}
	return []string{t.Schema, t.Name}
}

var advisoryLock = regexp.MustCompile(`^SELECT pg_advisory_xact_lock\(-?[0-9]{1,19}\)$`)

// FuzzSQLBuilders feeds every table name that dialect.ParseTable accepts to
// the Postgres dialect's SQL builders and checks that each statement is
// exactly its template with the name's parts quoted in, is one statement,
// and names no identifier but the expected ones.
func FuzzSQLBuilders(f *testing.F) {
	for _, s := range []string{
		"processed_messages", "app.processed_messages", "select", "from.where", "MixedCase", "app.Claims",
		"_", "a1.b2", strings.Repeat("n", dialect.MaxIdentifierBytes),
		strings.Repeat("s", dialect.MaxIdentifierBytes) + "." + strings.Repeat("n", dialect.MaxIdentifierBytes),
		`x"; DROP TABLE y; --`, "a;b", "a--b",
	} {
		f.Add(s)
	}
	d := postgres.New()
	f.Fuzz(func(t *testing.T, name string) {
		tb, err := dialect.ParseTable(name)
		if err != nil {
			return // rejected before any dialect sees it: FuzzParseTable covers that
		}
		if strings.ContainsAny(tb.Schema+tb.Name, "\"\x00") {
			t.Fatalf("ParseTable(%q) let a quote or NUL through: %+v", name, tb)
		}
		q := quoteParts(tb)
		check := func(what, got, want string, idents []string) {
			t.Helper()
			if got != want {
				t.Fatalf("%s for %q:\n got %q\nwant %q", what, name, got, want)
			}
			gotIdents, err := scanSQL(got)
			if err != nil {
				t.Fatalf("%s for %q is not one plain statement: %v\n%s", what, name, err, got)
			}
			if strings.Join(gotIdents, "\x00") != strings.Join(idents, "\x00") {
				t.Fatalf("%s for %q names identifiers %q, want %q", what, name, gotIdents, idents)
			}
		}
		check("ClaimSQL", d.ClaimSQL(tb),
			"INSERT INTO "+q+" (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING", parts(tb))

		schema := d.SchemaSQL(tb)
		if len(schema) != 4 {
			t.Fatalf("SchemaSQL for %q: %d statements, want 4", name, len(schema))
		}
		if !advisoryLock.MatchString(schema[0]) {
			t.Fatalf("SchemaSQL[0] for %q = %q, want SELECT pg_advisory_xact_lock(<int64>)", name, schema[0])
		}
		if _, err := strconv.ParseInt(schema[0][len("SELECT pg_advisory_xact_lock("):len(schema[0])-1], 10, 64); err != nil {
			t.Fatalf("SchemaSQL[0] for %q: lock key: %v", name, err)
		}
		check("SchemaSQL[1]", schema[1], "CREATE TABLE IF NOT EXISTS "+q+` (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key)
)`, parts(tb))
		check("SchemaSQL[2]", schema[2], `CREATE INDEX IF NOT EXISTS "`+postgres.IndexName(tb.Name)+`" ON `+q+" (processed_at)",
			append([]string{postgres.IndexName(tb.Name)}, parts(tb)...))
		ht := d.HorizonTable(tb)
		check("SchemaSQL[3]", schema[3], "CREATE TABLE IF NOT EXISTS "+ht.Quoted(pq.QuoteIdentifier)+` (
	consumer         text        PRIMARY KEY,
	forgotten_before timestamptz NOT NULL
)`, parts(ht))

		// The catalog checks take the name as a parameter, never as text.
		for _, partitioned := range []bool{false, true} {
			for _, o := range d.SchemaObjects(tb, partitioned) {
				if o.Table != tb && o.Table != ht {
					t.Fatalf("SchemaObjects(%q, %v): %v is not of the table or its horizon table", name, partitioned, o)
				}
				query, args := d.ObjectExistsSQL(o)
				fixed, _ := d.ObjectExistsSQL(dialect.SchemaObject{Kind: o.Kind, Table: dialect.Table{Name: "x"}, Name: "y"})
				if ids, err := scanSQL(query); err != nil || len(ids) != 0 || query != fixed {
					t.Fatalf("ObjectExistsSQL(%v) = %q (%q, %v): want a fixed query naming nothing", o, query, ids, err)
				}
				want := []any{o.Table.Quoted(pq.QuoteIdentifier)}
				if o.Kind == dialect.ObjectIndex {
					want = append(want, postgres.IndexName(tb.Name))
				}
				if fmt.Sprint(args) != fmt.Sprint(want) {
					t.Fatalf("ObjectExistsSQL(%v) args %q, want %q", o, args, want)
				}
			}
		}
	})
}

// maxLockTimeout is the largest lock_timeout Postgres accepts: INT_MAX
// milliseconds, about 24.8 days.
const maxLockTimeout = time.Duration(1<<31-1) * time.Millisecond

var setLockTimeout = regexp.MustCompile(`^SET LOCAL lock_timeout = (-?[0-9]+)$`)

// FuzzLockTimeoutSQL checks that every duration gives either no statement
// (d <= 0) or one SET LOCAL lock_timeout with an integer, and, within the
// range Postgres accepts, exactly d rounded up to whole milliseconds.
func FuzzLockTimeoutSQL(f *testing.F) {
	for _, d := range []time.Duration{0, -1, 1, time.Millisecond, time.Millisecond + 1, 1500 * time.Millisecond, maxLockTimeout, maxLockTimeout + 1} {
		f.Add(int64(d))
	}
	d := postgres.New()
	f.Fuzz(func(t *testing.T, n int64) {
		dur := time.Duration(n)
		got := d.LockTimeoutSQL(dur)
		if dur <= 0 {
			if got != "" {
				t.Fatalf("LockTimeoutSQL(%v) = %q, want no statement", dur, got)
			}
			return
		}
		m := setLockTimeout.FindStringSubmatch(got)
		if m == nil {
			t.Fatalf("LockTimeoutSQL(%v) = %q, want SET LOCAL lock_timeout = <integer>", dur, got)
		}
		if dur > maxLockTimeout {
			return // out of Postgres's range: see the note in the soak README
		}
		want := (n + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		if m[1] != strconv.FormatInt(want, 10) {
			t.Fatalf("LockTimeoutSQL(%v) = %q, want %d ms", dur, got, want)
		}
	})
}

// TestScanSQLRejects checks that the statement scanner used by the fuzz
// targets does catch what it is there to catch.
func TestScanSQLRejects(t *testing.T) {
	for _, s := range []string{
		`INSERT INTO "a"; DROP TABLE "b"`, `SELECT 1 -- x`, `SELECT /* x */ 1`, `SELECT 'x'`,
		`SELECT $$x$$`, `SELECT "a""b"`, `SELECT "a`, "SELECT \\x", "SELECT \x00",
	} {
		if _, err := scanSQL(s); err == nil {
			t.Errorf("scanSQL(%q) accepted it", s)
		}
	}
	ids, err := scanSQL(`INSERT INTO "s"."t" (a) VALUES ($1, $2)`)
	if err != nil || strings.Join(ids, ",") != "s,t" {
		t.Fatalf("scanSQL of a plain insert: %q, %v", ids, err)
	}
}
