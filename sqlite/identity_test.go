package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// readIdentity reads the name of table t on db.
func readIdentity(db *sql.DB, t dialect.Table) (string, error) {
	return New().Identity(context.Background(), t, func(ctx context.Context, q string, args ...any) (string, error) {
		var s sql.NullString
		err := db.QueryRowContext(ctx, q, args...).Scan(&s)
		return s.String, err
	})
}

// TestIdentitySQLGolden: the one query Identity sends, with its argument,
// for an unqualified and an attached database's table.
func TestIdentitySQLGolden(t *testing.T) {
	var b strings.Builder
	for _, tb := range []dialect.Table{{Name: "processed_messages"}, {Schema: "main", Name: "claims"}, {Schema: "tenant", Name: "claims"}} {
		fmt.Fprintf(&b, "-- table %q.%q\n", tb.Schema, tb.Name)
		id, err := New().Identity(context.Background(), tb, func(_ context.Context, q string, args ...any) (string, error) {
			fmt.Fprintf(&b, "%s;\n-- args %q\n", q, args)
			return "/data/app.db", nil
		})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "-- name %s\n\n", strings.Replace(id, " process "+process, " process <16 hex digits>", 1))
	}
	golden.Compare(t, filepath.Join("testdata", "identity_sql.golden"), b.String())
	boom := errors.New("boom")
	if _, err := New().Identity(context.Background(), dialect.Table{Name: "t"}, func(context.Context, string, ...any) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Errorf("a failed query: %v, want it wrapped", err)
	}
}

// TestIdentityOnFiles reads the name on real files: the same from two
// pools on one file, different for another file, the attached database's
// file for its tables, each with this process's number; an error for an
// unknown schema and for an in-memory database.
func TestIdentityOnFiles(t *testing.T) {
	db, path := openTemp(t)
	name, err := readIdentity(db, dialect.Table{Name: "claims"})
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	if name != "sqlite table main.claims file "+abs+" process "+process {
		t.Fatalf("identity %q, want the file %s", name, abs)
	}
	again, _ := openTemp(t)
	if a, err := readIdentity(again, dialect.Table{Schema: "main", Name: "claims"}); err != nil || a == name {
		t.Fatalf("another file: %q, %v; want a name other than %q", a, err, name)
	}
	same, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if s, err := readIdentity(same, dialect.Table{Name: "claims"}); err != nil || s != name {
		t.Fatalf("another pool on the file: %q, %v; want %q", s, err, name)
	}

	// An attached database: ATTACH holds for one connection.
	db.SetMaxOpenConns(1)
	other := filepath.Join(t.TempDir(), "tenant.db")
	if _, err := db.Exec("ATTACH DATABASE ? AS tenant", other); err != nil {
		t.Fatal(err)
	}
	otherAbs, _ := filepath.Abs(other)
	if a, err := readIdentity(db, dialect.Table{Schema: "tenant", Name: "claims"}); err != nil || a != "sqlite table tenant.claims file "+otherAbs+" process "+process {
		t.Fatalf("attached: %q, %v; want the file %s", a, err, otherAbs)
	}
	if _, err := readIdentity(db, dialect.Table{Schema: "nope", Name: "claims"}); err == nil || !strings.Contains(err.Error(), "no attached database") {
		t.Fatalf("an unknown schema: %v", err)
	}

	mem, err := sql.Open(DriverName, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if _, err := readIdentity(mem, dialect.Table{Name: "claims"}); err == nil || !strings.Contains(err.Error(), "in memory") {
		t.Fatalf("in memory: %v, want an error saying it has no file", err)
	}
}

// TestIdentityOfAnotherProcess: another process (this test binary run
// again) names the same file otherwise, as a restarted consumer does: the
// number it drew is its own.
func TestIdentityOfAnotherProcess(t *testing.T) {
	if path := os.Getenv("IDEMPOTENT_SQLITE_IDENTITY_OF"); path != "" {
		// The other process: print the name and stop.
		db, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		name, err := readIdentity(db, dialect.Table{Name: "claims"})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(name)
		return
	}
	if len(process) != 16 {
		t.Fatalf("process %q, want 16 hex digits", process)
	}
	db, path := openTemp(t)
	name, err := readIdentity(db, dialect.Table{Name: "claims"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdentityOfAnotherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMPOTENT_SQLITE_IDENTITY_OF="+path)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the other process: %v\n%s", err, out)
	}
	other, _, _ := strings.Cut(string(out), "\n")
	file, _, _ := strings.Cut(name, " process ")
	if !strings.HasPrefix(other, file+" process ") || other == name {
		t.Fatalf("the other process named the file %q, this one %q: want the same file and another process", other, name)
	}
}
