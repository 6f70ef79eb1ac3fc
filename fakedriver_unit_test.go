package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/txclaim/idempotent"
)

// A tiny in-memory driver for the guard's unit tests. Its connections come
// in three kinds, implementing more or fewer of database/sql's optional
// interfaces, so that every fallback path of the guard's wrappers runs:
//
//	legacy  driver.Conn only (Prepare, Close, Begin), statements with Exec and Query only
//	execer  legacy plus the old driver.Execer and driver.Queryer
//	modern  every context-aware interface, Pinger, SessionResetter, Validator,
//	        and NamedValueChecker on connection and statement
//
// Every call is logged as "c<N> <call> <query> <args>"; every statement
// affects one row and every query returns one row with the value 1.

type connKind int

const (
	legacy connKind = iota
	execer
	modern
)

type fakeConnector struct {
	kind connKind

	mu         sync.Mutex
	log        []string
	opened     int
	closed     int // Close calls on the connector
	connectors int // OpenConnector calls on ctxDriver

	connectErr error
	prepareErr error
	beginErr   error
	resetErr   error
	invalid    bool
	// execErr, when set, is what the modern connection's ExecContext
	// returns for a query (nil: success).
	execErr func(query string) error
}

func (f *fakeConnector) add(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf(format, a...))
}

func (f *fakeConnector) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// wantCalls fails the test unless the driver saw exactly want.
func (f *fakeConnector) wantCalls(t *testing.T, want ...string) {
	t.Helper()
	if got := f.calls(); !slices.Equal(got, want) {
		t.Fatalf("driver calls:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func (f *fakeConnector) Connect(context.Context) (driver.Conn, error) {
	if f.connectErr != nil {
		return nil, f.connectErr
	}
	f.mu.Lock()
	f.opened++
	base := &bareConn{f: f, id: f.opened}
	f.mu.Unlock()
	switch f.kind {
	case execer:
		return &execerConn{base}, nil
	case modern:
		return &modernConn{base}, nil
	}
	return base, nil
}

func (f *fakeConnector) Driver() driver.Driver { return fakeDriver{f} }

func (f *fakeConnector) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

type fakeDriver struct{ f *fakeConnector }

func (d fakeDriver) Open(string) (driver.Conn, error) { return d.f.Connect(context.Background()) }

// open returns a guarded database on f, closed in Cleanup after checking
// that no connection leaked.
func (f *fakeConnector) open(t *testing.T) *sql.DB {
	t.Helper()
	db := sql.OpenDB(idempotent.GuardConnector(f))
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
		_ = db.Close()
	})
	return db
}

func args(vals []driver.Value) string {
	s := make([]string, len(vals))
	for i, v := range vals {
		s[i] = fmt.Sprintf("%T(%v)", v, v)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func namedArgs(nvs []driver.NamedValue) string {
	vals := make([]driver.Value, len(nvs))
	for i, nv := range nvs {
		vals[i] = nv.Value
	}
	return args(vals)
}

// bareConn implements driver.Conn and nothing more.
type bareConn struct {
	f  *fakeConnector
	id int
}

func (c *bareConn) Prepare(q string) (driver.Stmt, error) {
	c.f.add("c%d prepare %s", c.id, q)
	return &bareStmt{c: c, q: q}, nil
}

func (c *bareConn) Close() error { return nil }

func (c *bareConn) Begin() (driver.Tx, error) { //nolint:staticcheck // the legacy path under test
	c.f.add("c%d begin", c.id)
	if c.f.beginErr != nil {
		return nil, c.f.beginErr
	}
	return &fakeTx{c}, nil
}

type fakeTx struct{ c *bareConn }

func (t *fakeTx) Commit() error {
	t.c.f.add("c%d commit", t.c.id)
	return nil
}

func (t *fakeTx) Rollback() error {
	t.c.f.add("c%d rollback", t.c.id)
	return nil
}

// execerConn adds the old, context-free Execer and Queryer.
type execerConn struct{ *bareConn }

func (c *execerConn) Exec(q string, a []driver.Value) (driver.Result, error) { //nolint:staticcheck // under test
	c.f.add("c%d exec %s %s", c.id, q, args(a))
	return driver.RowsAffected(1), nil
}

func (c *execerConn) Query(q string, a []driver.Value) (driver.Rows, error) { //nolint:staticcheck // under test
	c.f.add("c%d query %s %s", c.id, q, args(a))
	return &fakeRows{}, nil
}

// point is a value only the modern driver's NamedValueCheckers accept.
type point struct{ X, Y int }

// modernConn implements every optional interface the guard passes through.
type modernConn struct{ *bareConn }

func (c *modernConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.f.add("c%d begintx %s", c.id, sql.IsolationLevel(opts.Isolation))
	if c.f.beginErr != nil {
		return nil, c.f.beginErr
	}
	return &fakeTx{c.bareConn}, nil
}

func (c *modernConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.f.add("c%d preparectx %s", c.id, q)
	if c.f.prepareErr != nil {
		return nil, c.f.prepareErr
	}
	return &modernStmt{&bareStmt{c: c.bareConn, q: q}}, nil
}

func (c *modernConn) ExecContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Result, error) {
	c.f.add("c%d execctx %s %s", c.id, q, namedArgs(a))
	if c.f.execErr != nil {
		if err := c.f.execErr(q); err != nil {
			return nil, err
		}
	}
	return driver.RowsAffected(1), nil
}

func (c *modernConn) QueryContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Rows, error) {
	c.f.add("c%d queryctx %s %s", c.id, q, namedArgs(a))
	return &fakeRows{}, nil
}

func (c *modernConn) Ping(context.Context) error {
	c.f.add("c%d ping", c.id)
	return nil
}

func (c *modernConn) ResetSession(context.Context) error {
	c.f.add("c%d reset", c.id)
	return c.f.resetErr
}

func (c *modernConn) IsValid() bool { return !c.f.invalid }

func (c *modernConn) CheckNamedValue(nv *driver.NamedValue) error {
	if p, ok := nv.Value.(point); ok {
		nv.Value = fmt.Sprintf("conn(%d,%d)", p.X, p.Y)
		return nil
	}
	return driver.ErrSkip
}

// bareStmt implements driver.Stmt and nothing more.
type bareStmt struct {
	c *bareConn
	q string
}

func (s *bareStmt) Close() error  { return nil }
func (s *bareStmt) NumInput() int { return -1 }

func (s *bareStmt) Exec(a []driver.Value) (driver.Result, error) { //nolint:staticcheck // under test
	s.c.f.add("c%d stmt exec %s %s", s.c.id, s.q, args(a))
	return driver.RowsAffected(1), nil
}

func (s *bareStmt) Query(a []driver.Value) (driver.Rows, error) { //nolint:staticcheck // under test
	s.c.f.add("c%d stmt query %s %s", s.c.id, s.q, args(a))
	return &fakeRows{}, nil
}

type modernStmt struct{ *bareStmt }

func (s *modernStmt) ExecContext(ctx context.Context, a []driver.NamedValue) (driver.Result, error) {
	s.c.f.add("c%d stmt execctx %s %s", s.c.id, s.q, namedArgs(a))
	return driver.RowsAffected(1), nil
}

func (s *modernStmt) QueryContext(ctx context.Context, a []driver.NamedValue) (driver.Rows, error) {
	s.c.f.add("c%d stmt queryctx %s %s", s.c.id, s.q, namedArgs(a))
	return &fakeRows{}, nil
}

func (s *modernStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if p, ok := nv.Value.(point); ok {
		nv.Value = fmt.Sprintf("stmt(%d,%d)", p.X, p.Y)
		return nil
	}
	return driver.ErrSkip
}

type fakeRows struct{ done bool }

func (r *fakeRows) Columns() []string { return []string{"n"} }
func (r *fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = int64(1)
	return nil
}

// dsnDriver is a registered driver without DriverContext, and ctxDriver
// one with it, for OpenGuarded.
type dsnDriver struct{ f *fakeConnector }

func (d dsnDriver) Open(dsn string) (driver.Conn, error) {
	d.f.add("open %s", dsn)
	return d.f.Connect(context.Background())
}

type ctxDriver struct{ f *fakeConnector }

func (d ctxDriver) Open(dsn string) (driver.Conn, error) {
	return nil, errors.New("Open called instead of OpenConnector")
}

func (d ctxDriver) OpenConnector(dsn string) (driver.Connector, error) {
	d.f.add("connector %s", dsn)
	d.f.mu.Lock()
	d.f.connectors++
	n := d.f.connectors
	d.f.mu.Unlock()
	if dsn == "bad" || (dsn == "bad-second" && n == 2) {
		return nil, errors.New("bad dsn")
	}
	return ctxConnector{d.f, d}, nil
}

// ctxConnector is a connector of ctxDriver: its Driver is the one that
// opened it, as database/sql expects.
type ctxConnector struct {
	*fakeConnector
	d ctxDriver
}

func (c ctxConnector) Driver() driver.Driver { return c.d }

var (
	dsnConns = &fakeConnector{kind: modern}
	ctxConns = &fakeConnector{kind: modern}
)

func init() {
	sql.Register("idempotent-unit-dsn", dsnDriver{dsnConns})
	sql.Register("idempotent-unit-ctx", ctxDriver{ctxConns})
}
