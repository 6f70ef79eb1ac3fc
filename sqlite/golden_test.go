package sqlite

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the dialect's output")

// TestGoldenSQL compares every statement the dialect builds with
// testdata/*.golden. Run `go test ./sqlite -run TestGoldenSQL -update` after
// an intended change, and review the diff.
func TestGoldenSQL(t *testing.T) {
	d := New()
	for _, tc := range []struct{ file, table string }{
		{"default.golden", "processed_messages"},
		{"qualified.golden", "main.claims"},
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
			b.WriteString("-- lock timeout 1.5s\n" + orNone(d.LockTimeoutSQL(1500*time.Millisecond)) + "\n")
			b.WriteString("-- transaction id\n" + orNone(d.TxIDSQL()) + "\n")
			b.WriteString("-- server check\n" + versionSQL + ";\n")
			compareGolden(t, filepath.Join("testdata", tc.file), b.String())
		})
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none: unsupported)"
	}
	return s + ";"
}

func compareGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update and review the diff):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
