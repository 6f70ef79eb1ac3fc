package outbox

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
	q := postgresStatements(dialect.Table{Schema: "app", Name: "outbox"})
	for name, got := range map[string]string{
		"schema":         strings.Join(q.schema, ";\n\n"),
		"enqueue":        q.enqueue,
		"enqueue_notify": q.enqueueNotify,
		"lease":          q.lease,
		"mark_sent":      q.markSent,
		"mark_retry":     q.markRetry,
		"mark_dead":      q.markDead,
		"cleanup":        q.cleanup,
		"stats":          q.stats,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "postgres_"+name+".sql")
			golden.Compare(t, path, got+"\n")
		})
	}
}

// TestStatementsQuoteIdentifiers checks that a table name which is a
// reserved word, or has upper case, is quoted everywhere.
func TestStatementsQuoteIdentifiers(t *testing.T) {
	q := postgresStatements(dialect.Table{Schema: "Sales", Name: "order"})
	all := append(append([]string(nil), q.schema[1:]...), q.enqueue, q.enqueueNotify, q.lease, q.markSent, q.markRetry, q.markDead, q.cleanup, q.stats)
	for _, s := range all {
		if !strings.Contains(s, `"Sales"."order"`) {
			t.Errorf("statement does not name the quoted table:\n%s", s)
		}
		if strings.Contains(s, " Sales.") || strings.Contains(s, " order ") {
			t.Errorf("statement names the table unquoted:\n%s", s)
		}
	}
	for _, idx := range []string{`"order_due"`, `"order_sent_at"`, `"order_dead_at"`} {
		if !strings.Contains(strings.Join(q.schema, "\n"), idx) {
			t.Errorf("schema does not create index %s", idx)
		}
	}
}

func TestIndexNames(t *testing.T) {
	if got := indexName("outbox", "_due"); got != "outbox_due" {
		t.Errorf("indexName = %q", got)
	}
	a := indexName(strings.Repeat("a", 60)+"_one", "_sent_at")
	b := indexName(strings.Repeat("a", 60)+"_two", "_sent_at")
	if len(a) > 63 || len(b) > 63 || a == b || !strings.HasSuffix(a, "_sent_at") {
		t.Errorf("index names %q and %q: want distinct names of at most 63 bytes ending in _sent_at", a, b)
	}
}

func TestNotifyChannel(t *testing.T) {
	long := dialect.Table{Schema: strings.Repeat("s", 63), Name: strings.Repeat("t", 63)}
	a, b := notifyChannel(long), notifyChannel(dialect.Table{Name: "outbox"})
	if len(a) > 63 || len(b) > 63 || a == b {
		t.Errorf("channels %q and %q: want distinct names of at most 63 bytes", a, b)
	}
	if a != notifyChannel(long) {
		t.Error("channel name is not stable")
	}
}
