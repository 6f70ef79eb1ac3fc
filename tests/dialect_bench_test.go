package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// BenchmarkDialects measures one delivery through Process on each dialect,
// side by side in one run: a new key (claim, a one-row effect, commit), a
// duplicate (claim finds the row, rollback), and a new key with
// WithLockTimeout (one extra statement on Postgres, two on MySQL). Compare
// the dialects' ns/op within one run only.
//
//	go test -run '^$' -bench BenchmarkDialects -benchtime 2000x ./tests/
func BenchmarkDialects(b *testing.B) {
	type target struct {
		name  string
		d     dialect.Dialect
		open  func(b *testing.B) *sql.DB
		table func(b *testing.B, db *sql.DB) string
	}
	targets := []target{
		{"postgres", postgres.New(), func(b *testing.B) *sql.DB { return openDB(b) },
			func(b *testing.B, db *sql.DB) string { return tempSchema(b, db) + ".claims" }},
		{"mysql", mysql.New(), func(b *testing.B) *sql.DB {
			dsn := os.Getenv("IDEMPOTENT_MYSQL_DSN")
			if dsn == "" {
				dsn = "root@tcp(127.0.0.1:3306)/test"
			}
			db, err := sql.Open("mysql", dsn)
			if err == nil {
				err = db.Ping()
			}
			if err != nil {
				b.Skipf("no MySQL/MariaDB: %v", err)
			}
			b.Cleanup(func() { closeChecked(b, db) })
			return db
		}, func(b *testing.B, db *sql.DB) string {
			name := uniqueName("bench")
			b.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + name + ", " + name + "_fx") })
			return name
		}},
		{"sqlite", sqlite.New(), func(b *testing.B) *sql.DB {
			db, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { closeChecked(b, db) })
			return db
		}, func(*testing.B, *sql.DB) string { return uniqueName("bench") }},
	}
	for _, tg := range targets {
		for _, mode := range []string{"applied", "duplicate", "applied+locktimeout"} {
			b.Run(tg.name+"/"+mode, func(b *testing.B) {
				if tg.name == "sqlite" && mode == "applied+locktimeout" {
					b.Skip("the sqlite dialect has no lock timeout")
				}
				db := tg.open(b)
				db.SetMaxOpenConns(4)
				table := tg.table(b, db)
				var opts []idempotent.Option
				opts = append(opts, idempotent.WithTable(table))
				if mode == "applied+locktimeout" {
					opts = append(opts, idempotent.WithLockTimeout(2*time.Second))
				}
				mw, err := idempotent.New(db, tg.d, "bench", opts...)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if err := mw.EnsureSchema(ctx); err != nil {
					b.Fatal(err)
				}
				fx := table + "_fx"
				if _, err := db.Exec("CREATE TABLE " + fx + " (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Exec("INSERT INTO " + fx + " (id, n) VALUES (1, 0)"); err != nil {
					b.Fatal(err)
				}
				bump := func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "UPDATE "+fx+" SET n = n + 1 WHERE id = 1")
					return err
				}
				if mode == "duplicate" {
					if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, bump); err != nil {
						b.Fatal(err)
					}
				}
				want := idempotent.Applied
				if mode == "duplicate" {
					want = idempotent.Duplicate
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					key := "dup"
					if mode != "duplicate" {
						key = fmt.Sprintf("key-%d", i)
					}
					out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, bump)
					if err != nil || out != want {
						b.Fatalf("%v, %v; want %v", out, err, want)
					}
				}
			})
		}
	}
}
