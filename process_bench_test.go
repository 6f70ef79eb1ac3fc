package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"io"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/txclaim/idempotent"
)

// BenchmarkProcessMessage measures the middleware's own cost per message —
// everything but the database, which here answers at once — so that a
// change to the single-message path (such as the check for WithCoalescing)
// shows in ns/op and allocs/op.
func BenchmarkProcessMessage(b *testing.B) {
	db := sql.OpenDB(nopConnector{})
	b.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, pg, consumer)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	ctx := context.Background()
	handler := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, effectSQL)
		return err
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := "order-completed:" + strconv.FormatInt(n.Add(1), 10)
			if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, handler); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// nopConnector is a database whose every statement affects one row, at
// once.
type nopConnector struct{}

func (nopConnector) Connect(context.Context) (driver.Conn, error) { return nopConn{}, nil }
func (nopConnector) Driver() driver.Driver                        { return nil }

type nopConn struct{}

func (nopConn) Prepare(string) (driver.Stmt, error) { return nil, driver.ErrSkip }
func (nopConn) Close() error                        { return nil }
func (nopConn) Begin() (driver.Tx, error)           { return nopConn{}, nil } //nolint:staticcheck // driver.Conn requires it
func (nopConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return nopConn{}, nil
}
func (nopConn) Commit() error   { return nil }
func (nopConn) Rollback() error { return nil }
func (nopConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1), nil
}
func (nopConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return nopRows{}, nil
}

type nopRows struct{}

func (nopRows) Columns() []string         { return []string{"n"} }
func (nopRows) Close() error              { return nil }
func (nopRows) Next([]driver.Value) error { return io.EOF }
