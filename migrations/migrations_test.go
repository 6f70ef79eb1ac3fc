package migrations

import (
	"flag"
	"io/fs"
	"os"
	"path"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the embedded migration files from SQL")

// files returns what each embedded file must contain.
func files(t *testing.T) map[string]string {
	t.Helper()
	base := FileBase(DefaultTable)
	out := map[string]string{}
	for _, partitioned := range []bool{false, true} {
		gooseDir, migrateDir := GooseDir, GolangMigrateDir
		if partitioned {
			gooseDir, migrateDir = GoosePartitionedDir, GolangMigratePartitionedDir
		}
		g, err := GooseFile(DefaultTable, partitioned)
		if err != nil {
			t.Fatal(err)
		}
		out[path.Join(gooseDir, "00001_"+base+".sql")] = g
		up, down, err := GolangMigrateFiles(DefaultTable, partitioned)
		if err != nil {
			t.Fatal(err)
		}
		out[path.Join(migrateDir, "000001_"+base+".up.sql")] = up
		out[path.Join(migrateDir, "000001_"+base+".down.sql")] = down
		kbase := FileBase(DefaultKafkaOffsetsTable)
		if g, err = KafkaOffsetsGooseFile(DefaultKafkaOffsetsTable); err != nil {
			t.Fatal(err)
		}
		out[path.Join(gooseDir, "00002_"+kbase+".sql")] = g
		if up, down, err = KafkaOffsetsSQL(DefaultKafkaOffsetsTable); err != nil {
			t.Fatal(err)
		}
		out[path.Join(migrateDir, "000002_"+kbase+".up.sql")] = up
		out[path.Join(migrateDir, "000002_"+kbase+".down.sql")] = down
	}
	return out
}

// TestEmbeddedFilesMatchRenderedSQL keeps the shipped files equal to the
// DDL EnsureSchema runs. Run with -update to rewrite them.
func TestEmbeddedFilesMatchRenderedSQL(t *testing.T) {
	want := files(t)
	if *update {
		for name, body := range want {
			if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := 0
	err := fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		seen++
		body, ok := want[p]
		if !ok {
			t.Errorf("unexpected embedded file %s", p)
			return nil
		}
		got, err := fs.ReadFile(FS, p)
		if err != nil {
			return err
		}
		if string(got) != body {
			t.Errorf("%s differs from the rendered DDL (run go test ./migrations -update):\n--- got\n%s\n--- want\n%s", p, got, body)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Errorf("%d embedded files, want %d", seen, len(want))
	}
}

func TestGooseFileAnnotations(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		g, err := GooseFile("app.claims", partitioned)
		if err != nil {
			t.Fatal(err)
		}
		up := strings.Index(g, "-- +goose Up\n")
		down := strings.Index(g, "-- +goose Down\n")
		if up != 0 || down < up {
			t.Fatalf("annotations out of place:\n%s", g)
		}
		if !strings.Contains(g[:down], `CREATE TABLE IF NOT EXISTS "app"."claims"`) || !strings.Contains(g[down:], `DROP TABLE IF EXISTS "app"."claims", "app"."claims_horizon";`) {
			t.Errorf("partitioned=%v: up/down not for app.claims:\n%s", partitioned, g)
		}
		if got := strings.Contains(g, "PARTITION BY RANGE (event_day)"); got != partitioned {
			t.Errorf("partitioned=%v: PARTITION BY present=%v:\n%s", partitioned, got, g)
		}
		for _, line := range strings.Split(strings.TrimSpace(g), "\n") {
			if strings.Contains(line, "pg_advisory") {
				t.Errorf("migration carries EnsureSchema's lock: %s", line)
			}
		}
	}
}

func TestSQLRejectsBadTableNames(t *testing.T) {
	for _, name := range []string{"", "a.b.c", "bad name", "x;drop table y", "1abc"} {
		if _, _, err := SQL(name, false); err == nil {
			t.Errorf("SQL(%q) succeeded", name)
		}
		if _, err := GooseFile(name, true); err == nil {
			t.Errorf("GooseFile(%q) succeeded", name)
		}
	}
}

func TestKafkaOffsetsSQL(t *testing.T) {
	up, down, err := KafkaOffsetsSQL("app.offsets")
	if err != nil || !strings.Contains(up, `CREATE TABLE IF NOT EXISTS "app"."offsets" (`) || down != `DROP TABLE IF EXISTS "app"."offsets";`+"\n" {
		t.Fatalf("KafkaOffsetsSQL(app.offsets) = %q, %q, %v", up, down, err)
	}
	if _, _, err := KafkaOffsetsSQL("no such;table"); err == nil || !strings.Contains(err.Error(), "kafka offsets table") {
		t.Fatalf("a bad name: %v, want an error naming the offsets table", err)
	}
}
