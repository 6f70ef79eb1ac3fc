package kafka_test

import (
	"context"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/migrations"
)

// TestOffsetsMigrationFiles: kafka.SchemaSQL is the DDL of the migration
// files (package migrations checks its files against the same function),
// and the up migration creates the table.
func TestOffsetsMigrationFiles(t *testing.T) {
	up, down, err := kafka.SchemaSQL(kafka.DefaultOffsetsTable)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		path.Join(migrations.GolangMigrateDir, "000002_create_kafka_offsets.up.sql"):   up,
		path.Join(migrations.GolangMigrateDir, "000002_create_kafka_offsets.down.sql"): down,
	} {
		got, err := fs.ReadFile(migrations.FS, name)
		if err != nil || string(got) != want {
			t.Errorf("%s (%v) differs from kafka.SchemaSQL:\n--- got\n%s\n--- want\n%s", name, err, got, want)
		}
	}
	if _, _, err := kafka.SchemaSQL("no such;table"); err == nil || !strings.Contains(err.Error(), "kafka: offsets table") {
		t.Errorf("a bad name: %v, want an error naming the offsets table", err)
	}

	db := openDB(t, 2)
	s := schema(t, db)
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
	if _, err := conn.ExecContext(ctx, up); err != nil {
		t.Fatalf("the up migration: %v", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'kafka_offsets'`, s+"_m").Scan(&n); err != nil || n != 6 {
		t.Fatalf("the migrated table has %d columns (%v), want 6", n, err)
	}
}
