package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mysql"
)

// Example credits loyalty points exactly once on MySQL or MariaDB. It needs
// a server (here the local one with database "test"), so it is compiled
// but not run by go test; tests/conformance_test.go runs the same calls
// against a real server.
func Example() {
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	mw, err := idempotent.New(db, mysql.New(), "loyalty", idempotent.WithTable("processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	// Checks the server (MySQL or MariaDB, InnoDB) and creates the table.
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	outcome, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + ? WHERE customer_id = ?", 42, 7)
		return err
	})
	if err != nil {
		log.Fatal(err) // do not ack: the message will be delivered again
	}
	fmt.Println(outcome) // applied the first time, duplicate after
}
