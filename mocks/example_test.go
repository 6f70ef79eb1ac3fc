package mocks_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// OrderCompleted is the event a loyalty service consumes.
type OrderCompleted struct {
	OrderID    int64
	CustomerID int64
	TotalCents int64
}

func orderMessage(o OrderCompleted) (idempotent.Message, error) {
	if o.OrderID <= 0 {
		return idempotent.Message{}, fmt.Errorf("order id %d", o.OrderID)
	}
	return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
}

// creditPoints is the handler under test: it credits one point per 100
// cents and writes a ledger row, both through tx.
func creditPoints(ctx context.Context, tx *sql.Tx, o OrderCompleted) error {
	points := o.TotalCents / 100
	if _, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", points, o.CustomerID); err != nil {
		return fmt.Errorf("credit customer %d: %w", o.CustomerID, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)", o.CustomerID, o.OrderID, points); err != nil {
		return fmt.Errorf("ledger for order %d: %w", o.OrderID, err)
	}
	return nil
}

// loyalty returns the service's message handler on db, as the service's own
// constructor would build it.
func loyalty(db *sql.DB) func(context.Context, OrderCompleted) (idempotent.Outcome, error) {
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	return idempotent.WrapMessage(mw, orderMessage, creditPoints)
}

var order = OrderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

// expectCredit scripts creditPoints's two statements for order.
func expectCredit(m *mocks.Mock) {
	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectExec("INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)").
		WithArgs(7, 9912, 50).WillReturnResult(sqlmock.NewResult(1, 1))
}

// A first delivery claims the key, credits the points and commits.
func Example() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	handle := loyalty(db)

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectApplied("order-completed:9912")
	expectCredit(m)
	m.ExpectCommit()

	outcome, err := handle(context.Background(), order)
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// expectations met: true
}

// A redelivery finds the claim: the handler does not run and the
// transaction is rolled back.
func ExampleMock_ExpectDuplicate() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	handle := loyalty(db)

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectDuplicate("order-completed:9912")

	outcome, err := handle(context.Background(), order)
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// duplicate <nil>
	// expectations met: true
}

// A serialization failure (SQLSTATE 40001) on the claim rolls back and the
// middleware runs the whole transaction again.
func ExampleMock_ExpectClaimError() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	handle := loyalty(db)

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectClaimError("order-completed:9912", &pq.Error{Code: "40001"})
	m.ExpectApplied("order-completed:9912") // the retry
	expectCredit(m)
	m.ExpectCommit()

	outcome, err := handle(context.Background(), order)
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// expectations met: true
}

// A serialization failure at COMMIT is retried too; database/sql sends no
// ROLLBACK after a failed COMMIT.
func ExampleMock_ExpectCommitError() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	handle := loyalty(db)

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectApplied("order-completed:9912")
	expectCredit(m)
	m.ExpectCommitError(&pq.Error{Code: "40001"})
	m.ExpectApplied("order-completed:9912") // the retry
	expectCredit(m)
	m.ExpectCommit()

	outcome, err := handle(context.Background(), order)
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// expectations met: true
}

// When the handler's effect fails, claim and effect roll back together and
// the handler's error comes back: the message is not acked, and its
// redelivery will find no claim.
func ExampleMock_effectError() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	handle := loyalty(db)

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectApplied("order-completed:9912")
	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(50, 7).WillReturnError(&pq.Error{Code: "23514", Message: "points_nonnegative"})
	m.ExpectRollback()

	outcome, err := handle(context.Background(), order)
	var pqErr *pq.Error
	fmt.Println(outcome == 0, errors.As(err, &pqErr) && pqErr.Code == "23514")
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// true true
	// expectations met: true
}

// ForMiddleware reads the dialect, consumer and table from the Middleware;
// options it cannot read, such as the lock timeout, are given again.
func ExampleForMiddleware() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithTable("loyalty.processed_messages"),
		idempotent.WithLockTimeout(2*time.Second))
	if err != nil {
		panic(err)
	}

	m := mocks.ForMiddleware(mock, mw, mocks.WithLockTimeout(2*time.Second))
	m.ExpectDuplicate("order-completed:9912") // BEGIN, SET LOCAL lock_timeout, claim, ROLLBACK

	outcome, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
		return errors.New("not run for a duplicate")
	})
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// duplicate <nil>
	// expectations met: true
}

// In a test, New checks the expectations and closes the database when the
// test ends.
func ExampleNew() {
	testCreditsOnce := func(t *testing.T) {
		db, mock := mocks.New(t)
		handle := loyalty(db)

		m := mocks.For(mock, postgres.New(), "loyalty")
		m.ExpectApplied("order-completed:9912")
		expectCredit(m)
		m.ExpectCommit()
		m.ExpectDuplicate("order-completed:9912")

		for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
			if got, err := handle(context.Background(), order); err != nil || got != want {
				t.Fatalf("got (%v, %v), want %v", got, err, want)
			}
		}
	}
	_ = testCreditsOnce
}

// A batch of three orders, one of which was applied before: the handler
// runs once for the two new ones.
func ExampleMock_ExpectBatchApplied() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	keys := []string{"order-completed:3", "order-completed:1", "order-completed:2"}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectBatchApplied(keys, "order-completed:1", "order-completed:3")
	m.ExpectExec("UPDATE balances SET points = points + 10 WHERE customer_id = 7").WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()

	msgs := []idempotent.Message{{Key: keys[0]}, {Key: keys[1]}, {Key: keys[2]}}
	outcomes, err := mw.ProcessMessages(context.Background(), msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		fmt.Println("new:", fresh)
		_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + 10 WHERE customer_id = 7")
		return err
	})
	fmt.Println(outcomes, err)
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// new: [0 1]
	// [applied applied duplicate] <nil>
	// <nil>
}

// In partitioned mode a claim carries its event's UTC day, and a message
// older than the retention window is refused before anything is sent.
func ExampleMock_ExpectAppliedAt() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithDailyPartitions(2),
		idempotent.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	m := mocks.ForMiddleware(mock, mw) // reads the mode, the window and the clock
	at := now.Add(-2 * time.Hour)
	m.ExpectAppliedAt("order-completed:9912", at)
	expectCredit(m)
	m.ExpectCommit()
	old := now.AddDate(0, 0, -45)
	m.ExpectFenced(old)

	outcome, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912", EventTime: at}, func(ctx context.Context, tx *sql.Tx) error {
		return creditPoints(ctx, tx, order)
	})
	fmt.Println(outcome, err)
	_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9913", EventTime: old}, func(context.Context, *sql.Tx) error { return nil })
	fmt.Println(errors.Is(err, idempotent.ErrBeyondRetention))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// applied <nil>
	// true
	// <nil>
}

// A replay inside this Middleware's retention window whose claim a cleanup
// with a shorter window already deleted: the table's retention horizon
// refuses it, and the handler does not run.
func ExampleMock_ExpectBeyondHorizonAt() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithRetention(30*24*time.Hour),
		idempotent.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	m := mocks.ForMiddleware(mock, mw)
	at := now.AddDate(0, 0, -10)     // inside the 30-day window
	cleaned := now.AddDate(0, 0, -7) // a 7-day cleanup forgot claims processed before this
	m.ExpectBeyondHorizonAt("order-completed:9912", at, cleaned)

	_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "order-completed:9912", EventTime: at}, func(ctx context.Context, tx *sql.Tx) error {
		return creditPoints(ctx, tx, order)
	})
	fmt.Println(errors.Is(err, idempotent.ErrBeyondRetention))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// true
	// <nil>
}
