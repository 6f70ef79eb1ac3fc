package idempotent_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// exampleDB opens the Postgres at IDEMPOTENT_POSTGRES_DSN (default: the
// local test server) through the autocommit guard, and creates a schema of
// the example's own with a balances table for customers 7 and 8. done drops it and closes the DB.
func exampleDB() (db *sql.DB, schema string, done func()) {
	dsn := os.Getenv("IDEMPOTENT_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		log.Fatal(err)
	}
	db = sql.OpenDB(idempotent.GuardConnector(connector))
	db.SetMaxOpenConns(4)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "example_" + hex.EncodeToString(b)
	if _, err := db.Exec("CREATE SCHEMA " + schema + "; CREATE TABLE " + schema + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL); INSERT INTO " + schema + ".balances VALUES (7, 0), (8, 0)"); err != nil {
		log.Fatalf("the examples need Postgres at IDEMPOTENT_POSTGRES_DSN (%s): %v", dsn, err)
	}
	return db, schema, func() {
		if _, err := db.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			log.Print(err)
		}
		_ = db.Close()
	}
}

func ExampleMiddleware_Process() {
	db, schema, done := exampleDB()
	defer done()
	ctx := context.Background()

	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + $1 WHERE customer_id = $2", 50, 7)
		return err
	}

	// The broker delivers OrderCompleted:9912 twice.
	for range 2 {
		outcome, err := mw.Process(ctx, "order-completed:9912", credit)
		if err != nil {
			log.Fatal(err) // do not ack: the message will be redelivered
		}
		fmt.Println(outcome) // ack, whether applied or duplicate
	}

	var points int
	if err := db.QueryRowContext(ctx, "SELECT points FROM "+schema+".balances WHERE customer_id = 7").Scan(&points); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", points)
	// Output:
	// applied
	// duplicate
	// points: 50
}

// OrderCompleted is the event the loyalty service consumes.
type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

func ExampleWrap() {
	db, schema, done := exampleDB()
	defer done()
	ctx := context.Background()

	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}

	handle := idempotent.Wrap(mw,
		// The key: a stable, producer-assigned identity of the effect.
		func(o OrderCompleted) (string, error) {
			if o.OrderID == 0 {
				return "", errors.New("no order id")
			}
			return fmt.Sprintf("order-completed:%d", o.OrderID), nil
		},
		// The effect, in the claim's transaction.
		func(ctx context.Context, tx *sql.Tx, o OrderCompleted) error {
			_, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + $1 WHERE customer_id = $2", o.TotalCents/100, o.CustomerID)
			return err
		})

	for _, body := range []string{
		`{"order_id": 9912, "customer_id": 7, "total_cents": 5000}`,
		`{"order_id": 9912, "customer_id": 7, "total_cents": 5000}`, // redelivered
		`{"customer_id": 7}`, // poison: no key
	} {
		var o OrderCompleted
		if err := json.Unmarshal([]byte(body), &o); err != nil {
			log.Fatal(err)
		}
		outcome, err := handle(ctx, o)
		switch {
		case errors.Is(err, idempotent.ErrInvalidKey):
			fmt.Println("rejected:", err)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Println(outcome)
		}
	}
	// Output:
	// applied
	// duplicate
	// rejected: idempotent: invalid message key: key function: no order id
}

func ExampleMiddleware_Claim() {
	db, schema, done := exampleDB()
	defer done()
	ctx := context.Background()

	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}

	// A transaction the caller owns, as in code that already manages its
	// own: claim, apply only if claimed, commit both together.
	deliver := func() (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		claimed, err := mw.Claim(ctx, tx, "order-completed:9912")
		if err != nil || !claimed {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + 50 WHERE customer_id = 7"); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}
	for range 2 {
		claimed, err := deliver()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("claimed:", claimed)
	}
	// Output:
	// claimed: true
	// claimed: false
}

func ExampleGuardConnector() {
	db, schema, done := exampleDB() // opened through GuardConnector
	defer done()
	ctx := context.Background()

	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = mw.Process(ctx, "order-completed:9912", func(ctx context.Context, tx *sql.Tx) error {
		// The classic bug: db instead of tx. It would commit on its own.
		_, err := db.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + 50 WHERE customer_id = 7")
		return err
	})
	fmt.Println(errors.Is(err, idempotent.ErrAutocommit))

	var points int
	if err := db.QueryRowContext(ctx, "SELECT points FROM "+schema+".balances WHERE customer_id = 7").Scan(&points); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", points)
	// Output:
	// true
	// points: 0
}
