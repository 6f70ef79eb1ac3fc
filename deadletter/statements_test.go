package deadletter

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestStatementsGolden compares every statement with its golden file under
// testdata/. Run with -update to rewrite them after a deliberate change.
func TestStatementsGolden(t *testing.T) {
	q := postgresStatements(dialect.Table{Schema: "app", Name: "outbox"}, dialect.Table{Schema: "app", Name: "outbox_dead_letter_audit"})
	for name, got := range map[string]string{
		"schema":         strings.Join(q.schema, ";\n\n"),
		"list":           q.list,
		"lock":           q.lock,
		"record":         q.record,
		"set_replay_key": q.setReplayKey,
		"remove":         q.remove,
		"history":        q.history,
	} {
		t.Run(name, func(t *testing.T) {
			golden.Compare(t, filepath.Join("testdata", "postgres_"+name+".sql"), got+"\n")
		})
	}
}

// TestStatementsQuoteIdentifiers checks that table names which are
// reserved words, or have upper case, are quoted everywhere.
func TestStatementsQuoteIdentifiers(t *testing.T) {
	q := postgresStatements(dialect.Table{Schema: "Sales", Name: "order"}, dialect.Table{Schema: "Sales", Name: "select"})
	for _, s := range []string{q.list, q.lock, q.remove} {
		if !strings.Contains(s, `"Sales"."order"`) || strings.Contains(s, " Sales.") {
			t.Errorf("statement does not name the quoted outbox table:\n%s", s)
		}
	}
	for _, s := range append([]string{q.record, q.setReplayKey, q.history}, q.schema[1:]...) {
		if !strings.Contains(s, `"Sales"."select"`) {
			t.Errorf("statement does not name the quoted audit table:\n%s", s)
		}
	}
}
