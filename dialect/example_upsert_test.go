package dialect_test

import (
	"context"
	"fmt"
	"log"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// A version-guarded upsert makes last-writer-wins state harmless to
// redeliver and to reorder: a message with an older or equal version changes
// nothing. Here on go-sqlmock.
func ExampleNewVersionedUpsert() {
	up, err := dialect.NewVersionedUpsert(postgres.New(), dialect.VersionedUpsert{
		Table:   "order_status",
		Key:     []string{"order_id"},
		Version: "version",
		Columns: []string{"status"},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(up.SQL())

	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mock.ExpectExec(up.SQL()).WithArgs(9912, 3, "shipped").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(up.SQL()).WithArgs(9912, 2, "paid").WillReturnResult(sqlmock.NewResult(0, 0)) // arrives late

	ctx := context.Background()
	fmt.Println(up.Exec(ctx, db, 9912, 3, "shipped")) // in a handler: the *sql.Tx
	fmt.Println(up.Exec(ctx, db, 9912, 2, "paid"))
	// Output:
	// INSERT INTO "order_status" AS target ("order_id", "version", "status") VALUES ($1, $2, $3) ON CONFLICT ("order_id") DO UPDATE SET "version" = EXCLUDED."version", "status" = EXCLUDED."status" WHERE target."version" < EXCLUDED."version"
	// true <nil>
	// false <nil>
}
