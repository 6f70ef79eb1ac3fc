package mocks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// New returns a database backed by a new go-sqlmock mock that matches SQL
// text exactly (sqlmock.QueryMatcherEqual, ignoring differences in
// whitespace) and expects statements in the order they are scripted.
//
// When the test ends, New's cleanup fails the test if an expectation was not
// met or if a connection is still in use (a transaction or *sql.Rows left
// open), then closes the database.
//
// A connection that database/sql discards — after a driver returns
// driver.ErrBadConn — is replaced by a new one on the same mock, so a retry
// after a lost connection can be scripted like any other.
func New(t testing.TB) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := Open()
	if err != nil {
		t.Fatalf("mocks: %v", err)
	}
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 && !t.Failed() {
			t.Errorf("mocks: %d connection(s) still in use: a transaction or *sql.Rows was left open", n)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Errorf("mocks: %v", err)
		}
		_ = db.Close()
	})
	return db, mock
}

var seq atomic.Int64

// Open is New for code without a testing.TB, such as an Example function:
// the caller checks mock.ExpectationsWereMet and closes db itself.
func Open() (*sql.DB, sqlmock.Sqlmock, error) {
	dsn := fmt.Sprintf("idempotent-mocks-%d", seq.Add(1))
	// spare holds one connection to the mock open for db's lifetime: the
	// sqlmock driver forgets a mock when its last connection closes, and
	// database/sql closes a connection after driver.ErrBadConn.
	spare, mock, err := sqlmock.NewWithDSN(dsn, sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		return nil, nil, fmt.Errorf("mocks: %w", err)
	}
	db := sql.OpenDB(&connector{dsn: dsn, drv: spare.Driver(), spare: spare})
	return db, mock, nil
}

// connector opens connections to one mock and, when the database closes,
// lets go of the spare one.
type connector struct {
	dsn   string
	drv   driver.Driver
	spare *sql.DB
}

func (c *connector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c *connector) Driver() driver.Driver                        { return c.drv }

// Close closes the spare connection. The mock reports every connection's
// Close as unexpected unless ExpectClose was scripted; that is no failure
// of the code under test, so the error is dropped.
func (c *connector) Close() error {
	_ = c.spare.Close()
	return nil
}
