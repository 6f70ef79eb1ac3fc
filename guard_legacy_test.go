package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// A driver with none of the optional interfaces of database/sql/driver: only
// Prepare, Begin and Close, and statements with only Exec and Query — the
// oldest shape a driver may have. legacyExecer adds the deprecated
// Execer and Queryer. The guard must work over both.

type legacyLog struct {
	mu    sync.Mutex
	stmts []string
}

func (l *legacyLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, s)
}

func (l *legacyLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.stmts...)
}

type legacyConnector struct {
	log    *legacyLog
	execer bool
}

func (c legacyConnector) Connect(context.Context) (driver.Conn, error) {
	lc := &legacyConn{log: c.log}
	if c.execer {
		return &legacyExecer{lc}, nil
	}
	return lc, nil
}

func (c legacyConnector) Driver() driver.Driver { return legacyDriver{} }

type legacyDriver struct{}

func (legacyDriver) Open(string) (driver.Conn, error) { return nil, errors.New("use the connector") }

type legacyConn struct{ log *legacyLog }

func (c *legacyConn) Prepare(q string) (driver.Stmt, error) { return &legacyStmt{c: c, q: q}, nil }
func (c *legacyConn) Close() error                          { return nil }
func (c *legacyConn) Begin() (driver.Tx, error) { //nolint:staticcheck // the point of the test
	c.log.add("BEGIN")
	return legacyTx{c}, nil
}

type legacyExecer struct{ *legacyConn }

func (c *legacyExecer) Exec(q string, args []driver.Value) (driver.Result, error) { //nolint:staticcheck
	c.log.add("exec " + q)
	return driver.RowsAffected(1), nil
}

func (c *legacyExecer) Query(q string, args []driver.Value) (driver.Rows, error) { //nolint:staticcheck
	c.log.add("query " + q)
	return &legacyRows{}, nil
}

type legacyTx struct{ c *legacyConn }

func (t legacyTx) Commit() error   { t.c.log.add("COMMIT"); return nil }
func (t legacyTx) Rollback() error { t.c.log.add("ROLLBACK"); return nil }

type legacyStmt struct {
	c *legacyConn
	q string
}

func (s *legacyStmt) Close() error  { return nil }
func (s *legacyStmt) NumInput() int { return -1 }
func (s *legacyStmt) Exec(args []driver.Value) (driver.Result, error) { //nolint:staticcheck
	s.c.log.add("stmt exec " + s.q)
	return driver.RowsAffected(1), nil
}

func (s *legacyStmt) Query(args []driver.Value) (driver.Rows, error) { //nolint:staticcheck
	s.c.log.add("stmt query " + s.q)
	return &legacyRows{}, nil
}

type legacyRows struct{ done bool }

func (r *legacyRows) Columns() []string { return []string{"n"} }
func (r *legacyRows) Close() error      { return nil }
func (r *legacyRows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = int64(1)
	return nil
}

func TestGuardOverLegacyDrivers(t *testing.T) {
	for _, execer := range []bool{false, true} {
		name := "prepare only"
		if execer {
			name = "Execer and Queryer"
		}
		t.Run(name, func(t *testing.T) {
			log := &legacyLog{}
			db := sql.OpenDB(idempotent.GuardConnector(legacyConnector{log: log, execer: execer}))
			defer db.Close()
			ctx := context.Background()

			// Ordinary use passes through.
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "plain exec", 1, "two", []byte("3")); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "plain query").Scan(&n); err != nil || n != 1 {
				t.Fatalf("query: %v, %d", err, n)
			}
			if _, err := db.ExecContext(ctx, "named", sql.Named("a", 1)); err == nil || !strings.Contains(err.Error(), "named parameters") {
				t.Errorf("named parameter on a legacy driver: %v", err)
			}
			if _, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable}); err == nil || !strings.Contains(err.Error(), "transaction options") {
				t.Errorf("isolation level on a legacy driver: %v", err)
			}

			// Process: the claim, the handler through the tx, commit.
			mw, err := idempotent.New(db, postgres.New(), "loyalty")
			if err != nil {
				t.Fatal(err)
			}
			got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "effect"); err != nil {
					return err
				}
				var n int
				return tx.QueryRowContext(ctx, "read").Scan(&n)
			})
			if err != nil || got != idempotent.Applied {
				t.Fatalf("Process: (%v, %v)", got, err)
			}
			// An escaped statement, prepared or not, is refused.
			for _, escape := range []func(ctx context.Context) error{
				func(ctx context.Context) error { _, err := db.ExecContext(ctx, "escaped exec"); return err },
				func(ctx context.Context) error {
					var n int
					return db.QueryRowContext(ctx, "escaped query").Scan(&n)
				},
			} {
				_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "k2"}, func(ctx context.Context, tx *sql.Tx) error {
					_ = escape(ctx)
					return nil
				})
				if !errors.Is(err, idempotent.ErrAutocommit) {
					t.Errorf("escaped statement: %v, want ErrAutocommit", err)
				}
			}
			for _, s := range log.all() {
				if strings.Contains(s, "escaped") {
					t.Errorf("the escaped statement reached the driver: %q", s)
				}
			}
			if n := db.Stats().InUse; n != 0 {
				t.Errorf("%d connections in use", n)
			}
			t.Logf("driver saw: %q", log.all())
		})
	}
}
