package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/sqlite"
)

// Example opens a SQLite file configured for claims, creates the claim
// table and an effect table, and delivers the same message twice: the
// effect is applied once.
func Example() {
	dir, err := os.MkdirTemp("", "idempotent-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqlite.Open(filepath.Join(dir, "loyalty.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	mw, err := idempotent.New(db, sqlite.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE points (customer_id INTEGER PRIMARY KEY, points INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO points (customer_id, points) VALUES (7, 42)
			ON CONFLICT (customer_id) DO UPDATE SET points = points + excluded.points`)
		return err
	}
	for i := 0; i < 2; i++ {
		outcome, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, credit)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var points int
	if err := db.QueryRowContext(ctx, "SELECT points FROM points WHERE customer_id = 7").Scan(&points); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", points)
	// Output:
	// applied
	// duplicate
	// points: 42
}

// ExampleDSN opens the database with the autocommit guard, which needs a
// data source name rather than a *sql.DB.
func ExampleDSN() {
	dir, err := os.MkdirTemp("", "idempotent-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	dsn, err := sqlite.DSN(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	db, err := idempotent.OpenGuarded(sqlite.DriverName, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		log.Fatal(err)
	}
	fmt.Println(mode)
	// Output: wal
}
