package mysql

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestSchemaObjectsGolden compares the dialect.SchemaInspector side of the
// schema with testdata/schema_objects.golden: the objects, the catalog
// query that finds each, and the DDL's lock timeout.
func TestSchemaObjectsGolden(t *testing.T) {
	d := New()
	var b strings.Builder
	for _, name := range []string{"processed_messages", "shop.claims"} {
		tbl, err := dialect.ParseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range d.SchemaObjects(tbl, false) {
			q, args := d.ObjectExistsSQL(o)
			fmt.Fprintf(&b, "-- %v\n%s; -- %v\n%s;\n", o, q, args, o.CreateSQL)
		}
		if got := d.SchemaSQL(tbl); len(got) != 1 || got[0] != d.SchemaObjects(tbl, false)[0].CreateSQL {
			t.Errorf("SchemaSQL(%s) is not the table's CreateSQL: %q", name, got)
		}
		if s := d.SchemaLockSQL(tbl); s != "" {
			t.Errorf("SchemaLockSQL(%s) = %q, want none", name, s)
		}
		b.WriteString("\n")
	}
	for _, dur := range []time.Duration{5 * time.Second, 1500 * time.Millisecond, time.Millisecond} {
		stmt, session := d.DDLLockTimeoutSQL(dur)
		fmt.Fprintf(&b, "-- DDLLockTimeoutSQL(%v), session=%v\n%s;\n", dur, session, stmt)
	}
	golden.Compare(t, filepath.Join("testdata", "schema_objects.golden"), b.String())
}

func TestIsDDLLockTimeout(t *testing.T) {
	d := New()
	if !d.IsDDLLockTimeout(fmt.Errorf("create index: %w", &mysql.MySQLError{Number: 1205})) {
		t.Error("error 1205 is not a DDL lock timeout")
	}
	for _, err := range []error{nil, &mysql.MySQLError{Number: 1213}, &mysql.MySQLError{Number: 1061}, errors.New("1205")} {
		if d.IsDDLLockTimeout(err) {
			t.Errorf("IsDDLLockTimeout(%v) = true", err)
		}
	}
}
