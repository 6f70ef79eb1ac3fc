package tests

import (
	"context"
	"database/sql"
	"io/fs"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/migrations"
)

// execIn runs a migration file's SQL with schema first on the search path,
// as a migration tool connected to that schema would.
func execIn(t *testing.T, db *sql.DB, schema, sqlText string) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET search_path TO "+pq.QuoteIdentifier(schema)); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.ExecContext(ctx, "RESET search_path") }()
	if _, err := conn.ExecContext(ctx, sqlText); err != nil {
		t.Fatalf("migration failed: %v\n%s", err, sqlText)
	}
}

// gooseSections splits a goose file into its Up and Down SQL.
func gooseSections(t *testing.T, file string) (up, down string) {
	t.Helper()
	body, err := fs.ReadFile(migrations.FS, file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(body)
	u, d := strings.Index(s, "-- +goose Up\n"), strings.Index(s, "-- +goose Down\n")
	if u != 0 || d < 0 {
		t.Fatalf("%s: goose annotations missing:\n%s", file, s)
	}
	return s[len("-- +goose Up\n"):d], s[d+len("-- +goose Down\n"):]
}

// tableShape describes a claim table's columns, keys and indexes, with the
// schema name taken out, so that tables in two schemas can be compared.
func tableShape(t *testing.T, db *sql.DB, schema, table string) string {
	t.Helper()
	var shape strings.Builder
	q := func(query string, args ...any) {
		rows, err := db.Query(query, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			shape.WriteString(strings.ReplaceAll(line, schema, "S") + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	q(`SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`, schema, table)
	q(`SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY indexname`, schema, table)
	q(`SELECT coalesce(pg_get_partkeydef(c.oid), 'not partitioned') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table)
	return shape.String()
}

func TestMigrationFilesMatchEnsureSchema(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	base := migrations.FileBase(migrations.DefaultTable)
	for _, c := range []struct {
		name        string
		partitioned bool
		files       func(t *testing.T) (up, down string)
	}{
		{"goose", false, func(t *testing.T) (string, string) {
			return gooseSections(t, path.Join(migrations.GooseDir, "00001_"+base+".sql"))
		}},
		{"goose partitioned", true, func(t *testing.T) (string, string) {
			return gooseSections(t, path.Join(migrations.GoosePartitionedDir, "00001_"+base+".sql"))
		}},
		{"golang-migrate", false, func(t *testing.T) (string, string) {
			return migrateFiles(t, migrations.GolangMigrateDir, base)
		}},
		{"golang-migrate partitioned", true, func(t *testing.T) (string, string) {
			return migrateFiles(t, migrations.GolangMigratePartitionedDir, base)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			migrated, ensured := tempSchema(t, db), tempSchema(t, db)
			up, down := c.files(t)
			execIn(t, db, migrated, up)
			opts := []idempotent.Option{idempotent.WithClock(func() time.Time { return time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC) })}
			if c.partitioned {
				opts = append(opts, idempotent.WithDailyPartitions(1))
			}
			retMiddleware(t, db, ensured+".processed_messages", "loyalty", opts...)
			if got, want := tableShape(t, db, migrated, "processed_messages"), tableShape(t, db, ensured, "processed_messages"); got != want {
				t.Fatalf("the migration's table\n%s\ndiffers from EnsureSchema's\n%s", got, want)
			}

			// The middleware works on the migrated table: EnsureSchema
			// accepts it (and makes the partitions), and claims dedupe.
			mw := retMiddleware(t, db, migrated+".processed_messages", "loyalty", opts...)
			nop := func(context.Context, *sql.Tx) error { return nil }
			for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
				var got idempotent.Outcome
				var err error
				if c.partitioned {
					got, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:1", EventTime: time.Date(2031, 3, 14, 9, 0, 0, 0, time.UTC)}, nop)
				} else {
					got, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:1"}, nop)
				}
				if got != want || err != nil {
					t.Fatalf("delivery %d: (%v, %v), want %v", i+1, got, err, want)
				}
			}

			execIn(t, db, migrated, down)
			var n int
			if err := db.QueryRow("SELECT count(*) FROM pg_tables WHERE schemaname = $1", migrated).Scan(&n); err != nil || n != 0 {
				t.Fatalf("after the down migration %d tables are left (%v)", n, err)
			}
		})
	}
}

func migrateFiles(t *testing.T, dir, base string) (up, down string) {
	t.Helper()
	u, err := fs.ReadFile(migrations.FS, path.Join(dir, "000001_"+base+".up.sql"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := fs.ReadFile(migrations.FS, path.Join(dir, "000001_"+base+".down.sql"))
	if err != nil {
		t.Fatal(err)
	}
	return string(u), string(d)
}

// TestRenderedMigrationForAnotherTable applies the DDL rendered for a
// schema-qualified table name.
func TestRenderedMigrationForAnotherTable(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	up, down, err := migrations.SQL(schema+".claims", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(up); err != nil {
		t.Fatalf("%v\n%s", err, up)
	}
	mw := retMiddleware(t, db, schema+".claims", "loyalty")
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { return nil }); got != idempotent.Applied || err != nil {
		t.Fatalf("(%v, %v)", got, err)
	}
	if _, err := db.Exec(down); err != nil {
		t.Fatal(err)
	}
	if n := retCountTables(t, db, schema); n != 0 {
		t.Fatalf("%d tables left", n)
	}
}

func retCountTables(t *testing.T, db *sql.DB, schema string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
