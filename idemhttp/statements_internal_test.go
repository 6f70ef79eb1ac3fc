package idemhttp

import (
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// TestStatementsGolden pins the response table's SQL of every dialect: the
// migration's up and down of SchemaSQL, then the statements the
// Middleware runs, and on MySQL the upgrade of a table made by an earlier
// version (go test -update rewrites testdata/*.sql). It also checks
// that SchemaSQL's up is the DDL EnsureSchema runs.
func TestStatementsGolden(t *testing.T) {
	claims := dialect.Table{Schema: "shop", Name: "processed_messages"}
	resp := dialect.Table{Schema: "shop", Name: "processed_messages_http"}
	for _, d := range []dialect.Dialect{postgres.New(), mysql.New(), sqlite.New()} {
		t.Run(d.Name(), func(t *testing.T) {
			st, err := newStatements(d.Name(), resp, claims)
			if err != nil {
				t.Fatal(err)
			}
			up, down, err := SchemaSQL(d, resp.String())
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			b.WriteString("-- SchemaSQL up\n" + up + "\n-- SchemaSQL down\n" + down + "\n-- put, get, cleanup, stats\n")
			for _, q := range []string{st.put, st.get, st.cleanup, st.stats} {
				b.WriteString(q + ";\n\n")
			}
			if st.headerType != "" {
				b.WriteString("-- upgrade of a table made by an earlier version: header type, lock wait, widen\n")
				for _, q := range []string{st.headerType, st.lockWait, st.widenHeader} {
					b.WriteString(q + ";\n\n")
				}
			} else if st.lockWait != "" || st.widenHeader != "" {
				t.Error("an upgrade without its catalog read")
			}
			golden.Compare(t, "testdata/"+d.Name()+".sql", b.String())
			// up is EnsureSchema's statements, after its comment lines.
			var lines []string
			for l := range strings.SplitSeq(up, "\n") {
				if !strings.HasPrefix(l, "-- ") {
					lines = append(lines, l)
				}
			}
			if got, want := strings.Join(lines, "\n"), strings.Join(st.schema, ";\n")+";\n"; got != want {
				t.Errorf("SchemaSQL's up is not EnsureSchema's DDL:\n--- up\n%s\n--- EnsureSchema\n%s", got, want)
			}
		})
	}
	if _, err := newStatements("oracle", resp, claims); !errors.Is(err, ErrUnsupportedDialect) {
		t.Errorf("an unknown dialect: %v, want ErrUnsupportedDialect", err)
	}
}

// oracle is a dialect idemhttp has no response table for.
type oracle struct{ dialect.Dialect }

func (oracle) Name() string { return "oracle" }

// TestSchemaSQLRefusals checks SchemaSQL's errors: no dialect, a dialect
// without a response table, a table name that is not one.
func TestSchemaSQLRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     dialect.Dialect
		table string
		want  error
		text  string
	}{
		{"nil dialect", nil, "processed_messages_http", nil, "needs a dialect"},
		{"unknown dialect", oracle{}, "processed_messages_http", ErrUnsupportedDialect, `"oracle"`},
		{"quote in the name", postgres.New(), `x"; DROP TABLE y`, nil, "idemhttp: response table"},
		{"empty name", mysql.New(), "", nil, "idemhttp: response table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, down, err := SchemaSQL(tc.d, tc.table)
			if err == nil || up != "" || down != "" {
				t.Fatalf("up %q, down %q, err %v; want an error", up, down, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want one matching %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not say %q", err, tc.text)
			}
		})
	}
}
