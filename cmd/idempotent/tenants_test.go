package main

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/sqlite"
)

// TestTenantsFile runs stats and cleanup over a -tenants file of three
// SQLite tenant databases and one whose file is missing: every reachable
// tenant is cleaned exactly (its old claims deleted, its fresh one kept),
// the missing one is reported by name, and the run exits 1. Bad files and
// -tenants with -dsn are usage errors that touch no database.
func TestTenantsFile(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	dbs := map[string]*sql.DB{}
	for i, name := range []string{"acme", "globex", "initech"} {
		path := filepath.Join(dir, name+".db")
		cliOK(t, "migrate", "-dsn", "sqlite:"+path)
		db, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		dbs[name] = db
		seedOld(t, db, "processed_messages", "loyalty", 10*(i+1), "2020-01-01 00:00:00.000")
		if _, err := db.Exec("INSERT INTO processed_messages (consumer, message_key) VALUES ('loyalty', 'fresh')"); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, name+"="+"sqlite:"+path)
	}
	lines = append(lines, "# the next tenant's file is gone", "", "gone=sqlite:"+filepath.Join(dir, "gone.db"))
	file := filepath.Join(dir, "tenants")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runCLI(t, nil, "stats", "-tenants", file)
	if code != 1 || !strings.Contains(errOut, "tenant gone") {
		t.Fatalf("stats -tenants: exit %d, stderr %q; want 1 naming tenant gone\n%s", code, errOut, out)
	}
	for i, name := range []string{"acme", "globex", "initech"} {
		if !strings.Contains(out, "== tenant "+name+"\n") || !strings.Contains(out, fmt.Sprintf("claims    %d\n", 10*(i+1)+1)) {
			t.Errorf("stats -tenants does not show tenant %s with %d claims:\n%s", name, 10*(i+1)+1, out)
		}
	}
	code, out, errOut = runCLI(t, nil, "cleanup", "--tenants="+file, "-retention", "30d", "-batch", "7", "-min-batch", "1")
	if code != 1 || !strings.Contains(errOut, "1 of 4 tenants failed") || !strings.Contains(errOut, "tenant gone") {
		t.Fatalf("cleanup --tenants: exit %d, stderr %q; want 1, naming tenant gone\n%s", code, errOut, out)
	}
	for i, name := range []string{"acme", "globex", "initech"} {
		if !strings.Contains(out, fmt.Sprintf("deleted %d claims", 10*(i+1))) {
			t.Errorf("cleanup output has no \"deleted %d claims\" for %s:\n%s", 10*(i+1), name, out)
		}
		if n := countRows(t, dbs[name], "SELECT count(*) FROM processed_messages"); n != 1 {
			t.Errorf("tenant %s: %d claims left, want the fresh one", name, n)
		}
	}

	for _, tc := range []struct {
		file, want string
		args       []string
	}{
		{"acme\n", "line 1: want name=DSN", nil},
		{"a=sqlite:x\na=sqlite:y\n", `line 2: tenant "a" already on line 1`, nil},
		{"# nothing\n", "no tenants", nil},
		{"a b=sqlite:x\n", "has a space", nil},
		{"a=sqlite:x\nb=postgres://u:secret@host:notaport/db\n", "line 2: tenant b: bad connection string", nil},
		{"a=sqlite:x\n", "-min-batch 100 is larger than -batch 7", []string{"-batch", "7"}},
		{"a=sqlite:x\n", "-tenants and -dsn", []string{"-dsn", "sqlite:x"}},
	} {
		bad := filepath.Join(dir, "bad")
		if err := os.WriteFile(bad, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := runCLI(t, nil, append([]string{"cleanup", "-tenants", bad, "-retention", "30d"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("file %q %v: exit %d, stderr %q; want 2 and %q", tc.file, tc.args, code, errOut, tc.want)
		}
	}
}
