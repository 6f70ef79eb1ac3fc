package kafkatests

import (
	"context"
	"flag"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/migrations"
)

var update = flag.Bool("update", false, "rewrite the offsets table's migration files from kafka.SchemaSQL")

const offsetsComment = "-- Offsets table of github.com/txclaim/idempotent/kafka: the next offset to apply\n" +
	"-- of each (consumer, topic, partition), advanced in the claim's transaction.\n"

// offsetsMigrationFiles renders what each migration directory must hold for
// the offsets table.
func offsetsMigrationFiles(t *testing.T) map[string]string {
	t.Helper()
	up, down, err := kafka.SchemaSQL(kafka.DefaultOffsetsTable)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, dir := range []string{migrations.GooseDir, migrations.GoosePartitionedDir} {
		out[path.Join(dir, "00002_create_kafka_offsets.sql")] = "-- +goose Up\n" + offsetsComment + up + "\n-- +goose Down\n" + down
	}
	for _, dir := range []string{migrations.GolangMigrateDir, migrations.GolangMigratePartitionedDir} {
		out[path.Join(dir, "000002_create_kafka_offsets.up.sql")] = offsetsComment + up
		out[path.Join(dir, "000002_create_kafka_offsets.down.sql")] = down
	}
	return out
}

// TestOffsetsMigrationFiles keeps the migration files of the offsets table
// equal to the DDL EnsureSchema runs, and applies them.
func TestOffsetsMigrationFiles(t *testing.T) {
	want := offsetsMigrationFiles(t)
	if *update {
		for name, body := range want {
			if err := os.WriteFile(filepath.Join("..", "..", "migrations", name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Skip("rewrote the files; run the tests again without -update")
	}
	for name, body := range want {
		got, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatalf("%s: %v (run go test ./tests/kafka -run TestOffsetsMigrationFiles -update)", name, err)
		}
		if string(got) != body {
			t.Errorf("%s differs from kafka.SchemaSQL (run with -update):\n--- got\n%s\n--- want\n%s", name, got, body)
		}
	}

	db := openDB(t, 2)
	s := schema(t, db)
	up, err := fs.ReadFile(migrations.FS, path.Join(migrations.GolangMigrateDir, "000002_create_kafka_offsets.up.sql"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET search_path TO `+s+`_m`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE SCHEMA ` + s + `_m`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA ` + s + `_m CASCADE`) })
	if _, err := conn.ExecContext(ctx, string(up)); err != nil {
		t.Fatalf("the up migration: %v", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'kafka_offsets'`, s+"_m").Scan(&n); err != nil || n != 5 {
		t.Fatalf("the migrated table has %d columns (%v), want 5", n, err)
	}
}
