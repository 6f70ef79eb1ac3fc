package postgres_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/txclaim/idempotent/postgres"
)

// Check at start-up, on the consumers' own pool, whether an acked message
// can be lost in a failover, and refuse to start in a strict deployment.
func ExampleCheckReplication() {
	db, err := sql.Open("postgres", "host=db1,db2 dbname=app target_session_attrs=read-write")
	if err != nil {
		log.Fatal(err)
	}
	rep, err := postgres.CheckReplication(context.Background(), db)
	if err != nil {
		log.Fatal(err)
	}
	for _, w := range rep.Warnings() {
		log.Printf("replication: %s", w)
	}
	if err := rep.Err(); err != nil {
		log.Fatalf("refusing to consume: %v", err)
	}
}
