package idempotent_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// The guide's Step 4: the ledger's own unique key (one row per order) is the
// idempotency record, so no claim table is needed. The function reports
// whether its insert took effect; the transaction commits either way.
func ExampleMiddleware_ProcessNatural() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	const ledgerSQL = "INSERT INTO point_ledger (order_id, customer_id, points) VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING"
	for _, inserted := range []int64{1, 0} { // the first delivery inserts; the redelivery conflicts
		mock.ExpectBegin()
		mock.ExpectExec(ledgerSQL).WithArgs(9912, 7, 50).WillReturnResult(sqlmock.NewResult(0, inserted))
		mock.ExpectCommit()
	}

	credit := func(ctx context.Context, tx *sql.Tx) (bool, error) {
		res, err := tx.ExecContext(ctx, ledgerSQL, 9912, 7, 50)
		if err != nil {
			return false, err
		}
		n, err := res.RowsAffected()
		return n == 1, err
	}
	for range 2 {
		fmt.Println(mw.ProcessNatural(context.Background(), idempotent.Message{Key: "order-completed:9912"}, credit))
	}
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// duplicate <nil>
	// statements as scripted: true
}

// RunTx is Process's transaction-and-retry loop without a claim: a
// serialization failure rolls back and runs the function again.
func ExampleRunTx() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	const moveSQL = "UPDATE balances SET points = points - $1 WHERE customer_id = $2"
	mock.ExpectBegin()
	mock.ExpectExec(moveSQL).WithArgs(50, 7).WillReturnError(&pq.Error{Code: "40001"})
	mock.ExpectRollback()
	mock.ExpectBegin()
	mock.ExpectExec(moveSQL).WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()

	attempts := 0
	policy := idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}
	err = idempotent.RunTx(context.Background(), db, postgres.New(), nil, policy, func(ctx context.Context, tx *sql.Tx) error {
		attempts++
		_, err := tx.ExecContext(ctx, moveSQL, 50, 7)
		return err
	})
	fmt.Println("attempts:", attempts, "error:", err)
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// attempts: 2 error: <nil>
	// statements as scripted: true
}

// Counts is an Observer that counts outcomes in memory; its duplicate count
// is the broker's real redelivery rate.
func ExampleCounts() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	var counts idempotent.Counts
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithObserver(&counts))
	if err != nil {
		log.Fatal(err)
	}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectApplied("order-completed:9912")
	m.ExpectCommit()
	m.ExpectDuplicate("order-completed:9912")
	m.ExpectDuplicate("order-completed:9912")

	for range 3 {
		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912"}, func(context.Context, *sql.Tx) error { return nil }); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("applied:", counts.Applied(), "duplicates:", counts.Duplicates(), "failed:", counts.Failed())
	// Output:
	// applied: 1 duplicates: 2 failed: 0
}
