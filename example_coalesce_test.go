package idempotent_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// Three workers call ProcessMessage at once on a Middleware WithCoalescing:
// their messages share one transaction — in key order, each message's
// claim just before its handler, which runs on its own worker's goroutine,
// one COMMIT — and each worker gets its own outcome after that COMMIT. The
// message claimed before is a duplicate, and its handler does not run.
func ExampleWithCoalescing() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithCoalescing(idempotent.Coalescing{Max: 3, Wait: time.Second}))
	if err != nil {
		log.Fatal(err)
	}

	// What the database sees: one transaction for the three.
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectGroupBegin()
	m.ExpectGroupApplied("order-completed:1")
	m.ExpectExec(creditSQL).WithArgs(50, 1).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectGroupDuplicate("order-completed:2")
	m.ExpectGroupApplied("order-completed:3")
	m.ExpectExec(creditSQL).WithArgs(50, 3).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectGroupCommit()

	outcomes := make([]idempotent.Outcome, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() { // a broker adapter's worker
			defer wg.Done()
			customer := i + 1
			msg := idempotent.Message{Key: fmt.Sprintf("order-completed:%d", customer)}
			out, err := mw.ProcessMessage(context.Background(), msg, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, creditSQL, 50, customer)
				return err
			})
			if err != nil {
				log.Fatal(err) // do not ack: the broker redelivers
			}
			outcomes[i] = out // ack, applied or duplicate alike
		}()
	}
	wg.Wait()
	fmt.Println(outcomes)
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// [applied duplicate applied]
	// statements as scripted: true
}
