package idemhttp

import (
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestStatementsGolden pins the response table's SQL of every dialect
// (go test -update rewrites testdata/*.sql).
func TestStatementsGolden(t *testing.T) {
	claims := dialect.Table{Schema: "shop", Name: "processed_messages"}
	resp := dialect.Table{Schema: "shop", Name: "processed_messages_http"}
	for _, name := range []string{"postgres", "mysql", "sqlite"} {
		st, err := newStatements(name, resp, claims)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, q := range append(st.schema, st.put, st.get, st.cleanup) {
			b.WriteString(q + ";\n\n")
		}
		golden.Compare(t, "testdata/"+name+".sql", b.String())
	}
	if _, err := newStatements("oracle", resp, claims); !errors.Is(err, ErrUnsupportedDialect) {
		t.Errorf("an unknown dialect: %v, want ErrUnsupportedDialect", err)
	}
}
