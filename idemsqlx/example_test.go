package idemsqlx_test

import (
	"context"
	"fmt"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jmoiron/sqlx"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemsqlx"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// A handler on *sqlx.Tx with named queries, run on a go-sqlmock database:
// the first delivery applies, the redelivery is a duplicate.
func ExampleWrapMessage() {
	sqlDB, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	db := sqlx.NewDb(sqlDB, "postgres")
	mw, err := idempotent.New(sqlDB, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	handle := idemsqlx.WrapMessage(mw, orderMessage, db, func(ctx context.Context, tx *sqlx.Tx, o orderCompleted) error {
		c := credit{CustomerID: o.CustomerID, OrderID: o.OrderID, Points: o.TotalCents / 100}
		if _, err := tx.NamedExecContext(ctx, `UPDATE balances SET points = points + :points WHERE customer_id = :customer_id`, c); err != nil {
			return err
		}
		_, err := tx.NamedExecContext(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES (:customer_id, :order_id, :points)`, c)
		return err
	})

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectApplied("order-completed:9912")
	expectCredit(m) // the named queries, bound as $1, $2, …
	m.ExpectCommit()
	m.ExpectDuplicate("order-completed:9912")

	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	for range 2 {
		fmt.Println(handle(context.Background(), msg))
	}
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// duplicate <nil>
	// expectations met: true
}

// ProcessMessage runs one function on a *sqlx.Tx; Get and Select work
// inside it.
func ExampleProcessMessage() {
	sqlDB, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	db := sqlx.NewDb(sqlDB, "postgres")
	mw, err := idempotent.New(sqlDB, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectApplied("order-completed:9912")
	m.ExpectQuery("SELECT points FROM balances WHERE customer_id = $1").WithArgs(7).
		WillReturnRows(mock.NewRows([]string{"points"}).AddRow(120))
	m.ExpectCommit()

	var points int64
	outcome, err := idemsqlx.ProcessMessage(context.Background(), mw, idempotent.Message{Key: "order-completed:9912"}, db, func(ctx context.Context, tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &points, "SELECT points FROM balances WHERE customer_id = $1", 7)
	})
	fmt.Println(outcome, err, points)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil> 120
	// expectations met: true
}

// WrapMessages runs a batch handler on a *sqlx.Tx: one transaction claims
// the batch, and the handler gets the new messages.
func ExampleWrapMessages() {
	sqlDB, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	db := sqlx.NewDb(sqlDB, "postgres")
	mw, err := idempotent.New(sqlDB, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	handle := idemsqlx.WrapMessages(mw, orderMessage, db, func(ctx context.Context, tx *sqlx.Tx, os []orderCompleted) error {
		for _, o := range os {
			c := credit{CustomerID: o.CustomerID, OrderID: o.OrderID, Points: o.TotalCents / 100}
			if _, err := tx.NamedExecContext(ctx, `UPDATE balances SET points = points + :points WHERE customer_id = :customer_id`, c); err != nil {
				return err
			}
		}
		return nil
	})

	m := mocks.For(mock, postgres.New(), "loyalty")
	m.ExpectBatchApplied([]string{"order-completed:9912", "order-completed:9913"}, "order-completed:9913")
	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(20, 8).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()

	fmt.Println(handle(context.Background(), []orderCompleted{
		{OrderID: 9912, CustomerID: 7, TotalCents: 5000},
		{OrderID: 9913, CustomerID: 8, TotalCents: 2000},
	}))
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// [duplicate applied] <nil>
	// expectations met: true
}
