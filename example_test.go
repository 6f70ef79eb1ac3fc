package idempotent_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// The examples run on go-sqlmock (through package mocks), so `go test` needs
// no database: each one scripts the statements the middleware sends and the
// database's answers, and prints what the caller sees. The same scenarios run
// against a real Postgres in the tests module (tests/examples_test.go).

// creditSQL is the loyalty handler's effect.
const creditSQL = "UPDATE balances SET points = points + $1 WHERE customer_id = $2"

// A delivery is claimed, applied and committed; its redelivery finds the
// claim and is a duplicate, and its handler does not run. Ack after Process
// returns, whether the outcome is applied or duplicate.
func Example() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	// What the database sees: BEGIN, the claim inserts one row, the
	// handler's UPDATE, COMMIT; then BEGIN, the claim inserts nothing,
	// ROLLBACK.
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectApplied("order-completed:9912")
	m.ExpectExec(creditSQL).WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	m.ExpectDuplicate("order-completed:9912")

	credit := func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("crediting 50 points")
		_, err := tx.ExecContext(ctx, creditSQL, 50, 7)
		return err
	}
	// The broker delivers OrderCompleted 9912 twice.
	for range 2 {
		outcome, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912"}, credit)
		if err != nil {
			log.Fatal(err) // do not ack: the broker redelivers
		}
		fmt.Println(outcome) // ack, applied or duplicate alike
	}
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// crediting 50 points
	// applied
	// duplicate
	// statements as scripted: true
}

// OrderCompleted is the event the loyalty service consumes.
type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// WrapMessage turns a handler of decoded messages into one that takes the
// Message from the message. A message without a key is refused before
// anything is sent, with an error matching ErrInvalidKey: dead-letter it.
func ExampleWrapMessage_poison() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	handle := idempotent.WrapMessage(mw,
		// The key: a stable, producer-assigned identity of the effect.
		func(o OrderCompleted) (idempotent.Message, error) {
			if o.OrderID == 0 {
				return idempotent.Message{}, errors.New("no order id")
			}
			return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
		},
		// The effect, in the claim's transaction.
		func(ctx context.Context, tx *sql.Tx, o OrderCompleted) error {
			_, err := tx.ExecContext(ctx, creditSQL, o.TotalCents/100, o.CustomerID)
			return err
		})

	m := mocks.ForMiddleware(mock, mw)
	m.ExpectApplied("order-completed:9912")
	m.ExpectExec(creditSQL).WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	m.ExpectDuplicate("order-completed:9912")
	// The poison message sends nothing: no expectation for it.

	for _, body := range []string{
		`{"order_id": 9912, "customer_id": 7, "total_cents": 5000}`,
		`{"order_id": 9912, "customer_id": 7, "total_cents": 5000}`, // redelivered
		`{"customer_id": 7}`, // poison: no key
	} {
		var o OrderCompleted
		if err := json.Unmarshal([]byte(body), &o); err != nil {
			log.Fatal(err)
		}
		outcome, err := handle(context.Background(), o)
		switch {
		case errors.Is(err, idempotent.ErrInvalidKey):
			fmt.Println("rejected:", err)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Println(outcome)
		}
	}
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied
	// duplicate
	// rejected: idempotent: invalid message key: key function: no order id
	// statements as scripted: true
}

// ClaimMessage inserts the claim in a transaction the caller owns, for code
// that manages its own transactions: apply the effect only if claimed, and
// commit both together.
func ExampleMiddleware_ClaimMessage() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	m := mocks.ForMiddleware(mock, mw)
	mock.ExpectBegin()
	m.ExpectClaim("order-completed:9912").WillReturnResult(sqlmock.NewResult(0, 1)) // inserted
	mock.ExpectExec(creditSQL).WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()
	mock.ExpectBegin()
	m.ExpectClaim("order-completed:9912").WillReturnResult(sqlmock.NewResult(0, 0)) // already there
	mock.ExpectRollback()

	ctx := context.Background()
	deliver := func() (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		claimed, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "order-completed:9912"})
		if err != nil || !claimed {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, creditSQL, 50, 7); err != nil {
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
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// claimed: true
	// claimed: false
	// statements as scripted: true
}

// A handler that writes through the *sql.DB instead of its *sql.Tx would
// commit on its own, outside the claim's transaction. On a database opened
// through GuardConnector (here OpenGuarded, on a go-sqlmock driver) that
// statement fails with ErrAutocommit before it reaches the database, and the
// claim rolls back.
func ExampleGuardConnector() {
	_, mock, err := sqlmock.NewWithDSN("example-guard", sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		log.Fatal(err)
	}
	// With lib/pq: connector, err := pq.NewConnector(dsn);
	// db := sql.OpenDB(idempotent.GuardConnector(connector)).
	db, err := idempotent.OpenGuarded("sqlmock", "example-guard")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	m := mocks.ForMiddleware(mock, mw)
	m.ExpectApplied("order-completed:9912")
	mock.ExpectRollback() // and no UPDATE: it never reaches the database

	_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
		// The classic bug: db instead of tx.
		_, err := db.ExecContext(ctx, creditSQL, 50, 7)
		return err
	})
	fmt.Println(errors.Is(err, idempotent.ErrAutocommit))
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// true
	// statements as scripted: true
}

// An operator's tool lists the entities whose messages wait for a missing
// predecessor and skips one gap; the consumer's CheckGaps then applies
// what became next (the idempotent CLI's "order gaps" and "order skip").
func ExampleClaimTable_SkipGap() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	t, err := idempotent.NewClaimTable(db, postgres.New())
	if err != nil {
		log.Fatal(err)
	}
	waiting, err := t.Waiting(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range waiting {
		fmt.Printf("%s: %d applied, %d parked from %d since %s\n", g.OrderKey, g.LastSeq, g.Parked, g.NextParked, g.Since)
	}
	s, err := t.SkipGap(ctx, "ledger", "account:42", 5)
	if err != nil {
		log.Fatal(err) // nothing was changed
	}
	fmt.Printf("skipped %d..%d; %d parked messages are next\n", s.From, s.To, s.Next)
}
