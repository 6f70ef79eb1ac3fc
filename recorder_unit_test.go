package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// The unit tests run the middleware on go-sqlmock, which scripts the
// database's answers, through a recording layer, which logs every call
// that reaches the driver — including calls the mock rejects and the
// middleware ignores, such as a stray ROLLBACK. A test asserts both: the
// mock's expectations were met, and the log is exactly the statements
// wanted.

// recorded is a database on a mock, with the log of driver calls.
type recorded struct {
	db   *sql.DB
	mock sqlmock.Sqlmock
	mu   sync.Mutex
	log  []string
	// onCall, when set, runs after each call is logged, before it reaches
	// the mock.
	onCall func(call string)
	// connects counts the connections opened.
	connects atomic.Int64
}

var mockSeq atomic.Int64

// newRecorded returns a database on a fresh mock with exact SQL matching.
// Cleanup fails the test if an expectation is unmet or a connection is
// still in use, then closes the database.
func newRecorded(t *testing.T) *recorded {
	t.Helper()
	dsn := fmt.Sprintf("idempotent-unit-%d", mockSeq.Add(1))
	// spare keeps one connection to the mock open, so that the mock
	// survives database/sql discarding a connection after driver.ErrBadConn.
	spare, mock, err := sqlmock.NewWithDSN(dsn, sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	r := &recorded{mock: mock}
	r.db = sql.OpenDB(&recConnector{r: r, dsn: dsn, drv: spare.Driver()})
	t.Cleanup(func() {
		if n := r.db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Error(err)
		}
		_ = r.db.Close()
		_ = spare.Close()
	})
	return r
}

func (r *recorded) add(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	f := r.onCall
	r.mu.Unlock()
	if f != nil {
		f(s)
	}
}

// calls returns the log so far.
func (r *recorded) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// wantCalls fails the test unless the driver saw exactly want.
func (r *recorded) wantCalls(t *testing.T, want ...string) {
	t.Helper()
	if got := r.calls(); !slices.Equal(got, want) {
		t.Fatalf("driver calls:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

type recConnector struct {
	r   *recorded
	dsn string
	drv driver.Driver
}

func (c *recConnector) Connect(context.Context) (driver.Conn, error) {
	c.r.connects.Add(1)
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &recConn{r: c.r, c: conn}, nil
}

func (c *recConnector) Driver() driver.Driver { return c.drv }

// recConn logs and forwards to the mock's connection, which implements
// every interface used here.
type recConn struct {
	r *recorded
	c driver.Conn
}

func (c *recConn) Prepare(q string) (driver.Stmt, error) {
	c.r.add("PREPARE " + q)
	return c.c.Prepare(q)
}

func (c *recConn) Close() error { return c.c.Close() }

func (c *recConn) Begin() (driver.Tx, error) { //nolint:staticcheck // driver.Conn requires it
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *recConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	s := "BEGIN"
	if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) {
		s += " " + sql.IsolationLevel(opts.Isolation).String()
	}
	if opts.ReadOnly {
		s += " READ ONLY"
	}
	c.r.add(s)
	tx, err := c.c.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &recTx{r: c.r, tx: tx}, nil
}

func (c *recConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.r.add(q)
	return c.c.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *recConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.r.add(q)
	return c.c.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *recConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.c.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type recTx struct {
	r  *recorded
	tx driver.Tx
}

func (t *recTx) Commit() error {
	t.r.add("COMMIT")
	return t.tx.Commit()
}

func (t *recTx) Rollback() error {
	t.r.add("ROLLBACK")
	return t.tx.Rollback()
}
