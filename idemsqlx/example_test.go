package idemsqlx_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemsqlx"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// A handler on *sqlx.Tx with named queries, run on a go-sqlmock database:
// the first delivery applies, the redelivery is a duplicate.
func ExampleWrap() {
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
	handle := idemsqlx.Wrap(mw, db, orderKey, func(ctx context.Context, tx *sqlx.Tx, o orderCompleted) error {
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

// Process runs one function on a *sqlx.Tx; Get and Select work inside it.
func ExampleProcess() {
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
	outcome, err := idemsqlx.Process(context.Background(), mw, db, "order-completed:9912", func(ctx context.Context, tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &points, "SELECT points FROM balances WHERE customer_id = $1", 7)
	})
	fmt.Println(outcome, err, points)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil> 120
	// expectations met: true
}
