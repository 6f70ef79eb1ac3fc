package idempotent_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// Ledger is a library's transaction type wrapping *sql.Tx, as sqlx's
// *sqlx.Tx does.
type Ledger struct{ *sql.Tx }

// Credit adds points to a customer's balance.
func (l Ledger) Credit(ctx context.Context, customer, points int64) error {
	_, err := l.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", points, customer)
	return err
}

// beginLedger begins each attempt's transaction as a Ledger.
func beginLedger(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (Ledger, *sql.Tx, error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return Ledger{}, nil, err
	}
	return Ledger{tx}, tx, nil
}

// ProcessMessageTx hands the function the library's transaction type; here
// on a go-sqlmock database.
func ExampleProcessMessageTx() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	msg := idempotent.Message{Key: "order-completed:9912", EventTime: time.Now().Add(-time.Minute)}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectAppliedAt(msg.Key, msg.EventTime)
	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()

	outcome, err := idempotent.ProcessMessageTx(context.Background(), mw, msg, beginLedger,
		func(ctx context.Context, l Ledger) error { return l.Credit(ctx, 7, 50) })
	fmt.Println(outcome, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied <nil>
	// expectations met: true
}

// WrapMessageTx is WrapMessage for handlers of the library's transaction
// type.
func ExampleWrapMessageTx() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	type orderCompleted struct {
		OrderID, CustomerID, Points int64
		OccurredAt                  time.Time
	}
	handle := idempotent.WrapMessageTx(mw,
		func(o orderCompleted) (idempotent.Message, error) {
			return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID), EventTime: o.OccurredAt}, nil
		},
		beginLedger,
		func(ctx context.Context, l Ledger, o orderCompleted) error {
			return l.Credit(ctx, o.CustomerID, o.Points)
		})

	occurred := time.Now().Add(-time.Hour)
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectDuplicateAt("order-completed:9912", occurred)

	fmt.Println(handle(context.Background(), orderCompleted{OrderID: 9912, CustomerID: 7, Points: 50, OccurredAt: occurred}))
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// duplicate <nil>
	// expectations met: true
}

// ProcessMessagesTx is ProcessMessages on the library's transaction type:
// one transaction claims the batch, and the function gets it as a Ledger
// with the indexes of the new messages.
func ExampleProcessMessagesTx() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	msgs := []idempotent.Message{{Key: "order-completed:9913"}, {Key: "order-completed:9912"}}
	mocks.ForMiddleware(mock, mw).ExpectMessagesApplied(msgs, "order-completed:9913")
	mock.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(20, 8).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()

	points := []struct{ customer, points int64 }{{8, 20}, {7, 50}}
	outcomes, err := idempotent.ProcessMessagesTx(context.Background(), mw, msgs, beginLedger,
		func(ctx context.Context, l Ledger, fresh []int) error {
			for _, i := range fresh {
				if err := l.Credit(ctx, points[i].customer, points[i].points); err != nil {
					return err
				}
			}
			return nil
		})
	fmt.Println(outcomes, err)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// [applied duplicate] <nil>
	// expectations met: true
}

// WrapMessagesTx is WrapMessages for handlers of the library's transaction
// type: the handler gets the new messages of the batch, decoded.
func ExampleWrapMessagesTx() {
	db, mock, err := mocks.Open()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		panic(err)
	}
	type orderCompleted struct{ OrderID, CustomerID, Points int64 }
	handle := idempotent.WrapMessagesTx(mw,
		func(o orderCompleted) (idempotent.Message, error) {
			return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
		},
		beginLedger,
		func(ctx context.Context, l Ledger, os []orderCompleted) error {
			for _, o := range os {
				if err := l.Credit(ctx, o.CustomerID, o.Points); err != nil {
					return err
				}
			}
			return nil
		})

	m := mocks.ForMiddleware(mock, mw)
	m.ExpectMessagesDuplicate([]idempotent.Message{{Key: "order-completed:9912"}, {Key: "order-completed:9913"}})

	fmt.Println(handle(context.Background(), []orderCompleted{{9912, 7, 50}, {9913, 8, 20}}))
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// [duplicate duplicate] <nil>
	// expectations met: true
}
