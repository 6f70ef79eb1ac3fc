package sqlite

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestSchemaObjectsGolden compares the dialect.SchemaInspector side of the
// schema with testdata/schema_objects.golden: the objects and the catalog
// query that finds each.
func TestSchemaObjectsGolden(t *testing.T) {
	d := New()
	var b strings.Builder
	for _, name := range []string{"processed_messages", "aux.claims"} {
		tbl, err := dialect.ParseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		objs := d.SchemaObjects(tbl, false)
		for i, o := range objs {
			q, args := d.ObjectExistsSQL(o)
			fmt.Fprintf(&b, "-- %v\n%s; -- %v\n%s;\n", o, q, args, o.CreateSQL)
			if s := d.SchemaSQL(tbl); len(s) != len(objs) || s[i] != o.CreateSQL {
				t.Errorf("SchemaSQL(%s) is not the objects' CreateSQL: %q", name, s)
			}
		}
		b.WriteString("\n")
	}
	if s := d.SchemaLockSQL(dialect.Table{Name: "t"}); s != "" {
		t.Errorf("SchemaLockSQL = %q, want none", s)
	}
	if s, session := d.DDLLockTimeoutSQL(time.Second); s != "" || session {
		t.Errorf("DDLLockTimeoutSQL = %q, %v; want none: the busy timeout bounds the wait", s, session)
	}
	golden.Compare(t, filepath.Join("testdata", "schema_objects.golden"), b.String())
}
