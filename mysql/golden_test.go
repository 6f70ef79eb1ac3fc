package mysql

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestGoldenSQL compares every statement the dialect builds with
// testdata/*.golden. Run `go test ./mysql -run TestGoldenSQL -update` after
// an intended change, and review the diff.
func TestGoldenSQL(t *testing.T) {
	d := New()
	for _, tc := range []struct{ file, table string }{
		{"default.golden", "processed_messages"},
		{"qualified.golden", "shop.claims"},
		{"reserved.golden", "order"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tbl, err := dialect.ParseTable(tc.table)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for i, s := range d.SchemaSQL(tbl) {
				b.WriteString("-- schema " + string(rune('1'+i)) + "\n" + s + ";\n")
			}
			b.WriteString("-- claim\n" + d.ClaimSQL(tbl) + ";\n")
			b.WriteString("-- lock timeout 1.5s\n" + d.LockTimeoutSQL(1500*time.Millisecond) + ";\n")
			b.WriteString("-- lock timeout 1ms\n" + d.LockTimeoutSQL(time.Millisecond) + ";\n")
			b.WriteString("-- lock timeout reset\n" + d.LockTimeoutResetSQL() + ";\n")
			b.WriteString("-- transaction id\n" + d.TxIDSQL() + ";\n")
			b.WriteString("-- server check\n" + strings.Join([]string{versionSQL, databaseSQL, innodbSQL, tableEngineSQL}, ";\n") + ";\n")
			golden.Compare(t, filepath.Join("testdata", tc.file), b.String())
		})
	}
	if s := d.LockTimeoutSQL(0); s != "" {
		t.Errorf("LockTimeoutSQL(0) = %q, want \"\"", s)
	}
}

// TestOrderSQLGolden covers the dialect.Orderer statements.
func TestOrderSQLGolden(t *testing.T) {
	var ts []dialect.Table
	for _, name := range []string{"processed_messages", "shop.claims", "order", "t" + strings.Repeat("x", 60)} {
		tbl, err := dialect.ParseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tbl)
	}
	golden.Compare(t, filepath.Join("testdata", "order_sql.golden"), golden.Orderer(New(), ts...))
}
