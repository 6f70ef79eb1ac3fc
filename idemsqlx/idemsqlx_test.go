package idemsqlx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idemsqlx"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// orderCompleted is the loyalty service's event.
type orderCompleted struct {
	OrderID    int64 `db:"order_id"`
	CustomerID int64 `db:"customer_id"`
	TotalCents int64 `db:"total_cents"`
}

func orderMessage(o orderCompleted) (idempotent.Message, error) {
	if o.OrderID <= 0 {
		return idempotent.Message{}, fmt.Errorf("order id %d", o.OrderID)
	}
	return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
}

// credit is the named-query parameter struct of the handler's effect.
type credit struct {
	CustomerID int64 `db:"customer_id"`
	OrderID    int64 `db:"order_id"`
	Points     int64 `db:"points"`
}

const (
	creditSQL = `UPDATE balances SET points = points + :points WHERE customer_id = :customer_id`
	ledgerSQL = `INSERT INTO point_ledger (customer_id, order_id, points) VALUES (:customer_id, :order_id, :points)`
)

// creditPoints is a handler written against sqlx: named queries through tx.
func creditPoints(ctx context.Context, tx *sqlx.Tx, o orderCompleted) error {
	c := credit{CustomerID: o.CustomerID, OrderID: o.OrderID, Points: o.TotalCents / 100}
	if _, err := tx.NamedExecContext(ctx, creditSQL, c); err != nil {
		return err
	}
	_, err := tx.NamedExecContext(ctx, ledgerSQL, c)
	return err
}

var msg = orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

// expectCredit scripts creditPoints's statements as sqlx binds them for
// Postgres.
func expectCredit(m *mocks.Mock) {
	m.ExpectExec(`UPDATE balances SET points = points + $1 WHERE customer_id = $2`).
		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectExec(`INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)`).
		WithArgs(7, 9912, 50).WillReturnResult(sqlmock.NewResult(1, 1))
}

func setup(t *testing.T, opts ...idempotent.Option) (*sqlx.DB, *idempotent.Middleware, *mocks.Mock) {
	t.Helper()
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sqlx.NewDb(db, "postgres"), mw, mocks.ForMiddleware(mock, mw)
}

func TestWrapNamedQueries(t *testing.T) {
	sdb, mw, m := setup(t)
	handle := idemsqlx.WrapMessage(mw, orderMessage, sdb, creditPoints)
	m.ExpectApplied("order-completed:9912")
	expectCredit(m)
	m.ExpectCommit()
	m.ExpectDuplicate("order-completed:9912")
	for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if got, err := handle(context.Background(), msg); err != nil || got != want {
			t.Fatalf("got (%v, %v), want %v", got, err, want)
		}
	}
}

// TestRetryGetsNewTx checks every attempt's handler gets the *sqlx.Tx of
// that attempt, with the database's driver name.
func TestRetryGetsNewTx(t *testing.T) {
	sdb, mw, m := setup(t, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3}))
	m.ExpectApplied("k")
	m.ExpectExec("SELECT 1").WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectCommitError(&pq.Error{Code: "40001"})
	m.ExpectApplied("k")
	m.ExpectExec("SELECT 1").WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectCommit()
	var seen []*sqlx.Tx
	got, err := idemsqlx.ProcessMessage(context.Background(), mw, idempotent.Message{Key: "k"}, sdb, func(ctx context.Context, tx *sqlx.Tx) error {
		if tx.DriverName() != "postgres" {
			t.Errorf("driver name %q, want postgres", tx.DriverName())
		}
		seen = append(seen, tx)
		_, err := tx.ExecContext(ctx, "SELECT 1")
		return err
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	if len(seen) != 2 || seen[0] == seen[1] || seen[0].Tx == seen[1].Tx {
		t.Fatalf("handler saw transactions %p, want two different ones", seen)
	}
}

// TestBindTypeFollowsDriverName runs the same named query for a driver
// that binds with ?, on a dialect that does too.
func TestBindTypeFollowsDriverName(t *testing.T) {
	db, mock := mocks.New(t)
	d := qDialect{}
	mw, err := idempotent.New(db, d, "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	m := mocks.For(mock, d, "loyalty")
	m.ExpectApplied("k")
	m.ExpectExec(`UPDATE balances SET points = points + ? WHERE customer_id = ?`).
		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	got, err := idemsqlx.ProcessMessage(context.Background(), mw, idempotent.Message{Key: "k"}, sqlx.NewDb(db, "mysql"), func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := tx.NamedExecContext(ctx, creditSQL, credit{CustomerID: 7, Points: 50})
		return err
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
}

// qDialect is a dialect with ? parameters.
type qDialect struct{}

func (qDialect) Name() string                        { return "q" }
func (qDialect) MaxKeyBytes() int                    { return 255 }
func (qDialect) SchemaSQL(dialect.Table) []string    { return nil }
func (qDialect) LockTimeoutSQL(time.Duration) string { return "" }
func (qDialect) TxIDSQL() string                     { return "" }
func (qDialect) Classify(error) dialect.Class        { return dialect.Class{} }
func (qDialect) ClaimSQL(t dialect.Table) string {
	return "INSERT IGNORE INTO " + t.Name + " (consumer, message_key) VALUES (?, ?)"
}

func TestHandlerErrorRollsBack(t *testing.T) {
	sdb, mw, m := setup(t)
	m.ExpectApplied("order-completed:9912")
	m.ExpectExec(`UPDATE balances SET points = points + $1 WHERE customer_id = $2`).
		WithArgs(50, 7).WillReturnError(&pq.Error{Code: "23514"})
	m.ExpectRollback()
	_, err := idemsqlx.WrapMessage(mw, orderMessage, sdb, creditPoints)(context.Background(), msg)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "23514" {
		t.Fatalf("got %v, want the handler's 23514", err)
	}
}

// TestRejects covers the errors returned before any statement is sent: the
// mock has no expectations, so a statement would fail the test.
func TestRejects(t *testing.T) {
	sdb, mw, _ := setup(t)
	other, _ := mocks.New(t)
	ctx := context.Background()
	noop := func(context.Context, *sqlx.Tx) error { return nil }
	cases := []struct {
		name string
		run  func() error
		is   error
	}{
		{"other database", func() error {
			_, err := idemsqlx.ProcessMessage(ctx, mw, idempotent.Message{Key: "k"}, sqlx.NewDb(other, "postgres"), noop)
			return err
		}, idemsqlx.ErrOtherDB},
		{"nil database", func() error {
			_, err := idemsqlx.ProcessMessage(ctx, mw, idempotent.Message{Key: "k"}, nil, noop)
			return err
		}, idemsqlx.ErrOtherDB},
		{"wrap other database", func() error {
			_, err := idemsqlx.WrapMessage(mw, orderMessage, sqlx.NewDb(other, "postgres"), creditPoints)(ctx, msg)
			return err
		}, idemsqlx.ErrOtherDB},
		{"key function fails", func() error {
			_, err := idemsqlx.WrapMessage(mw, orderMessage, sdb, creditPoints)(ctx, orderCompleted{})
			return err
		}, idempotent.ErrInvalidKey},
		{"invalid key", func() error {
			_, err := idemsqlx.ProcessMessage(ctx, mw, idempotent.Message{Key: ""}, sdb, noop)
			return err
		}, idempotent.ErrInvalidKey},
		{"nil function", func() error {
			_, err := idemsqlx.ProcessMessage(ctx, mw, idempotent.Message{Key: "k"}, sdb, nil)
			return err
		}, nil},
		{"nil handler", func() error {
			_, err := idemsqlx.WrapMessage[orderCompleted](mw, orderMessage, sdb, nil)(ctx, msg)
			return err
		}, nil},
		{"nil key function", func() error {
			_, err := idemsqlx.WrapMessage(mw, nil, sdb, creditPoints)(ctx, msg)
			return err
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			if err == nil || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("got %v, want an error matching %v", err, c.is)
			}
		})
	}
}

func TestBeginError(t *testing.T) {
	sdb, mw, m := setup(t)
	boom := errors.New("too many connections")
	m.ExpectBegin().WillReturnError(boom)
	_, err := idemsqlx.ProcessMessage(context.Background(), mw, idempotent.Message{Key: "k"}, sdb, func(context.Context, *sqlx.Tx) error {
		t.Error("handler ran without a transaction")
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the begin error", err)
	}
}

// TestMessageEventTime checks the Message forms carry the event time: in
// partitioned mode it chooses the claim's day, and one beyond the retention
// window is refused before any statement.
func TestMessageEventTime(t *testing.T) {
	now := time.Date(2031, 3, 16, 12, 0, 0, 0, time.UTC)
	sdb, mw, m := setup(t, idempotent.WithDailyPartitions(2), idempotent.WithClock(func() time.Time { return now }))
	at := time.Date(2031, 3, 14, 9, 0, 0, 0, time.UTC)
	m.ExpectBegin()
	m.ExpectClaimAt("order-completed:9912", at).WillReturnResult(sqlmock.NewResult(0, 1))
	expectCredit(m)
	m.ExpectCommit()
	handle := idemsqlx.WrapMessage(mw, func(o orderCompleted) (idempotent.Message, error) {
		m, err := orderMessage(o)
		m.EventTime = at
		return m, err
	}, sdb, creditPoints)
	if got, err := handle(context.Background(), msg); err != nil || got != idempotent.Applied {
		t.Fatalf("WrapMessage: got (%v, %v), want applied", got, err)
	}
	old := idempotent.Message{Key: "order-completed:1", EventTime: now.AddDate(0, 0, -40)}
	if got, err := idemsqlx.ProcessMessage(context.Background(), mw, old, sdb, func(context.Context, *sqlx.Tx) error {
		t.Error("the function ran")
		return nil
	}); got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("ProcessMessage beyond retention: got (%v, %v)", got, err)
	}
}
