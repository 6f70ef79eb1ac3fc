package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
)

// Unit tests of the autocommit guard's driver wrappers, on the fake driver
// of fakedriver_unit_test.go.

const claimArgs = "[string(loyalty) string(order-completed:9912)]"

func guardedMiddleware(t *testing.T, db *sql.DB, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	mw, err := idempotent.New(db, pg, consumer, append([]idempotent.Option{noWait}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func TestGuardPassesTransactionStatements(t *testing.T) {
	f := &fakeConnector{kind: modern}
	mw := guardedMiddleware(t, f.open(t))
	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, effectSQL); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&n); err != nil {
			return err
		}
		stmt, err := tx.PrepareContext(ctx, "INSERT INTO ledger VALUES ($1)")
		if err != nil {
			return err
		}
		defer stmt.Close()
		_, err = stmt.ExecContext(ctx, 5)
		return err
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	f.wantCalls(t,
		"c1 begintx Default",
		"c1 execctx "+claimSQL+" "+claimArgs,
		"c1 execctx "+effectSQL+" []",
		"c1 queryctx SELECT 1 []",
		"c1 preparectx INSERT INTO ledger VALUES ($1)",
		"c1 stmt execctx INSERT INTO ledger VALUES ($1) [int64(5)]",
		"c1 commit")
}

// TestGuardCatchesEscapes runs handlers that send a statement with their
// context outside the transaction, then ignore the error: the statement
// never reaches the driver and the delivery rolls back with ErrAutocommit.
func TestGuardCatchesEscapes(t *testing.T) {
	cases := []struct {
		name string
		// escape runs the stray statement; conn is a connection of the
		// pool reserved before the delivery, with a statement prepared on it.
		escape func(ctx context.Context, db *sql.DB, conn *sql.Conn, stmt *sql.Stmt) error
		want   string
	}{
		{"exec on the database", func(ctx context.Context, db *sql.DB, _ *sql.Conn, _ *sql.Stmt) error {
			_, err := db.ExecContext(ctx, "UPDATE escaped")
			return err
		}, `exec "UPDATE escaped"`},
		{"query on the database", func(ctx context.Context, db *sql.DB, _ *sql.Conn, _ *sql.Stmt) error {
			rows, err := db.QueryContext(ctx, "SELECT escaped")
			if err == nil {
				rows.Close()
			}
			return err
		}, `query "SELECT escaped"`},
		{"prepare on the database", func(ctx context.Context, db *sql.DB, _ *sql.Conn, _ *sql.Stmt) error {
			s, err := db.PrepareContext(ctx, "INSERT escaped")
			if err == nil {
				s.Close()
			}
			return err
		}, `prepare "INSERT escaped"`},
		{"exec on a reserved connection", func(ctx context.Context, _ *sql.DB, conn *sql.Conn, _ *sql.Stmt) error {
			_, err := conn.ExecContext(ctx, "UPDATE escaped")
			return err
		}, `exec "UPDATE escaped"`},
		{"prepared statement exec", func(ctx context.Context, _ *sql.DB, _ *sql.Conn, stmt *sql.Stmt) error {
			_, err := stmt.ExecContext(ctx, 1)
			return err
		}, `exec "UPDATE prepared"`},
		{"prepared statement query", func(ctx context.Context, _ *sql.DB, _ *sql.Conn, stmt *sql.Stmt) error {
			rows, err := stmt.QueryContext(ctx, 1)
			if err == nil {
				rows.Close()
			}
			return err
		}, `query "UPDATE prepared"`},
		{"second transaction", func(ctx context.Context, db *sql.DB, _ *sql.Conn, _ *sql.Stmt) error {
			tx, err := db.BeginTx(ctx, nil)
			if err == nil {
				_ = tx.Rollback()
			}
			return err
		}, "a second transaction"},
		{"long statement", func(ctx context.Context, db *sql.DB, _ *sql.Conn, _ *sql.Stmt) error {
			_, err := db.ExecContext(ctx, "UPDATE "+strings.Repeat("x", 100))
			return err
		}, `exec "UPDATE ` + strings.Repeat("x", 73) + `…"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeConnector{kind: modern}
			db := f.open(t)
			bg := context.Background()
			conn, err := db.Conn(bg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			stmt, err := conn.PrepareContext(bg, "UPDATE prepared")
			if err != nil {
				t.Fatal(err)
			}
			defer stmt.Close()
			mw := guardedMiddleware(t, db)

			var escErr error
			got, err := mw.ProcessMessage(bg, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
				escErr = c.escape(ctx, db, conn, stmt)
				return nil // the handler ignores the error
			})
			if !errors.Is(escErr, idempotent.ErrAutocommit) || !strings.Contains(escErr.Error(), c.want) {
				t.Fatalf("the stray statement got %v, want ErrAutocommit naming %s", escErr, c.want)
			}
			if got != 0 || !errors.Is(err, idempotent.ErrAutocommit) {
				t.Fatalf("got (%v, %v), want ErrAutocommit", got, err)
			}
			f.wantCalls(t,
				"c1 preparectx UPDATE prepared",
				"c2 begintx Default",
				"c2 execctx "+claimSQL+" "+claimArgs,
				"c2 rollback")
		})
	}
}

func TestGuardJoinsHandlerError(t *testing.T) {
	f := &fakeConnector{kind: modern}
	db := f.open(t)
	mw := guardedMiddleware(t, db)
	_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		_, _ = db.ExecContext(ctx, "UPDATE escaped")
		return errHandler
	})
	if !errors.Is(err, errHandler) || !errors.Is(err, idempotent.ErrAutocommit) {
		t.Fatalf("got %v, want the handler's error joined with ErrAutocommit", err)
	}
}

// TestGuardLeavesOtherContextsAlone shows the guard's documented limit: a
// statement with another context is not the handler's as far as it knows.
func TestGuardLeavesOtherContextsAlone(t *testing.T) {
	f := &fakeConnector{kind: modern}
	db := f.open(t)
	mw := guardedMiddleware(t, db)
	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := db.ExecContext(context.Background(), "UPDATE elsewhere")
		return err
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	f.wantCalls(t,
		"c1 begintx Default",
		"c1 execctx "+claimSQL+" "+claimArgs,
		"c2 execctx UPDATE elsewhere []",
		"c1 commit")
}

func TestGuardRunTxAndProcessTx(t *testing.T) {
	escape := func(db *sql.DB) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, _ *sql.Tx) error {
			_, _ = db.ExecContext(ctx, "UPDATE escaped")
			return nil
		}
	}
	t.Run("RunTx", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		db := f.open(t)
		err := idempotent.RunTx(context.Background(), db, pg, nil, idempotent.RetryPolicy{MaxAttempts: 1}, escape(db))
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got %v, want ErrAutocommit", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 rollback")
	})
	t.Run("ProcessTx", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		db := f.open(t)
		mw := guardedMiddleware(t, db)
		begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
			tx, err := db.BeginTx(ctx, opts)
			return tx, tx, err
		}
		_, err := idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, escape(db))
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got %v, want ErrAutocommit", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 rollback")
	})
}

// TestGuardLegacyDriver runs a delivery on a driver with none of the
// optional interfaces: Begin without options, statements prepared and run
// through driver.Stmt's Exec.
func TestGuardLegacyDriver(t *testing.T) {
	f := &fakeConnector{kind: legacy}
	db := f.open(t)
	mw := guardedMiddleware(t, db)
	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, effectSQL, 5); err != nil {
			return err
		}
		var n int
		return tx.QueryRowContext(ctx, "SELECT $1", 1).Scan(&n)
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	f.wantCalls(t,
		"c1 begin",
		"c1 prepare "+claimSQL,
		"c1 stmt exec "+claimSQL+" "+claimArgs,
		"c1 prepare "+effectSQL,
		"c1 stmt exec "+effectSQL+" [int64(5)]",
		"c1 prepare SELECT $1",
		"c1 stmt query SELECT $1 [int64(1)]",
		"c1 commit")
}

func TestGuardLegacyDriverRejects(t *testing.T) {
	f := &fakeConnector{kind: legacy}
	db := f.open(t)
	ctx := context.Background()
	t.Run("transaction options", func(t *testing.T) {
		for _, o := range []*sql.TxOptions{{Isolation: sql.LevelSerializable}, {ReadOnly: true}} {
			err := idempotent.RunTx(ctx, db, pg, o, idempotent.RetryPolicy{MaxAttempts: 1}, func(context.Context, *sql.Tx) error { return nil })
			if err == nil || !strings.Contains(err.Error(), "does not support transaction options") {
				t.Fatalf("%+v: got %v", o, err)
			}
		}
	})
	t.Run("named parameters", func(t *testing.T) {
		if _, err := db.ExecContext(ctx, "UPDATE x", sql.Named("a", 1)); err == nil || !strings.Contains(err.Error(), "named parameters") {
			t.Fatalf("exec: got %v", err)
		}
		if _, err := db.QueryContext(ctx, "SELECT x", sql.Named("a", 1)); err == nil || !strings.Contains(err.Error(), "named parameters") {
			t.Fatalf("query: got %v", err)
		}
	})
	t.Run("default value conversion", func(t *testing.T) {
		if _, err := db.ExecContext(ctx, "UPDATE point", point{1, 2}); err == nil || !strings.Contains(err.Error(), "unsupported type") {
			t.Fatalf("a struct passed the default converter: %v", err)
		}
		if _, err := db.ExecContext(ctx, "UPDATE valuer", valuer("v")); err != nil {
			t.Fatal(err)
		}
	})
	if got := f.calls(); !slices.Contains(got, "c1 stmt exec UPDATE valuer [string(valued v)]") {
		t.Fatalf("driver calls %q, want the Valuer's value", got)
	}
	if got := f.calls(); slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "c1 begin") }) {
		t.Fatalf("driver calls %q: a transaction began despite the options", got)
	}
}

// valuer is a driver.Valuer: the default conversion calls it.
type valuer string

func (v valuer) Value() (driver.Value, error) { return "valued " + string(v), nil }

func TestGuardExecerDriver(t *testing.T) {
	f := &fakeConnector{kind: execer}
	db := f.open(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "UPDATE x", 5); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT x", "a").Scan(&n); err != nil || n != 1 {
		t.Fatalf("query: got (%d, %v)", n, err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE x", sql.Named("a", 1)); err == nil || !strings.Contains(err.Error(), "named parameters") {
		t.Fatalf("named exec: got %v", err)
	}
	if _, err := db.QueryContext(ctx, "SELECT x", sql.Named("a", 1)); err == nil || !strings.Contains(err.Error(), "named parameters") {
		t.Fatalf("named query: got %v", err)
	}
	f.wantCalls(t, "c1 exec UPDATE x [int64(5)]", "c1 query SELECT x [string(a)]")
}

// TestGuardModernDriver checks the wrappers pass the driver's own
// interfaces through: its value checkers, Ping, ResetSession and IsValid.
func TestGuardModernDriver(t *testing.T) {
	ctx := context.Background()
	t.Run("value checkers", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		db := f.open(t)
		if _, err := db.ExecContext(ctx, "UPDATE conn", point{1, 2}, 3); err != nil {
			t.Fatal(err)
		}
		stmt, err := db.PrepareContext(ctx, "UPDATE stmt")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, point{3, 4}); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := stmt.QueryRowContext(ctx, point{5, 6}).Scan(&n); err != nil {
			t.Fatal(err)
		}
		f.wantCalls(t,
			"c1 execctx UPDATE conn [string(conn(1,2)) int64(3)]",
			"c1 reset",
			"c1 preparectx UPDATE stmt",
			"c1 reset",
			"c1 stmt execctx UPDATE stmt [string(stmt(3,4))]",
			"c1 reset",
			"c1 stmt queryctx UPDATE stmt [string(stmt(5,6))]")
	})
	t.Run("ping", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		if err := f.open(t).PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		f.wantCalls(t, "c1 ping")
		l := &fakeConnector{kind: legacy}
		if err := l.open(t).PingContext(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("session reset fails", func(t *testing.T) {
		f := &fakeConnector{kind: modern, resetErr: driver.ErrBadConn}
		db := f.open(t)
		for range 2 {
			if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
				t.Fatal(err)
			}
		}
		f.wantCalls(t, "c1 execctx UPDATE x []", "c1 reset", "c2 execctx UPDATE x []")
	})
	t.Run("invalid connection", func(t *testing.T) {
		f := &fakeConnector{kind: modern, invalid: true}
		db := f.open(t)
		for range 2 {
			if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
				t.Fatal(err)
			}
		}
		f.wantCalls(t, "c1 execctx UPDATE x []", "c2 execctx UPDATE x []")
	})
	t.Run("legacy defaults keep connections", func(t *testing.T) {
		f := &fakeConnector{kind: execer}
		db := f.open(t)
		for range 2 {
			if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
				t.Fatal(err)
			}
		}
		f.wantCalls(t, "c1 exec UPDATE x []", "c1 exec UPDATE x []")
	})
}

// TestGuardRawConnection checks sql.Conn.Raw sees the wrapper, that Unwrap
// returns the driver's connection, and that the context-free Begin and
// Prepare still work.
func TestGuardRawConnection(t *testing.T) {
	f := &fakeConnector{kind: modern}
	db := f.open(t)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		u, ok := dc.(interface{ Unwrap() driver.Conn })
		if !ok {
			return errors.New("the guarded connection has no Unwrap")
		}
		if _, ok := u.Unwrap().(*modernConn); !ok {
			return errors.New("Unwrap did not return the driver's connection")
		}
		c := dc.(driver.Conn)
		tx, err := c.Begin() //nolint:staticcheck // the context-free path under test
		if err != nil {
			return err
		}
		if err := tx.Rollback(); err != nil {
			return err
		}
		s, err := c.Prepare("SELECT raw")
		if err != nil {
			return err
		}
		return s.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	f.wantCalls(t, "c1 begintx Default", "c1 rollback", "c1 preparectx SELECT raw")
}

func TestGuardConnector(t *testing.T) {
	t.Run("close reaches the driver's connector", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		db := sql.OpenDB(idempotent.GuardConnector(f))
		if err := db.Close(); err != nil || f.closed != 1 {
			t.Fatalf("close: %v, connector closed %d times", err, f.closed)
		}
	})
	t.Run("connector without Close", func(t *testing.T) {
		db := sql.OpenDB(idempotent.GuardConnector(struct{ driver.Connector }{&fakeConnector{}}))
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("connect error", func(t *testing.T) {
		refused := errors.New("connection refused")
		f := &fakeConnector{kind: modern, connectErr: refused}
		if err := f.open(t).PingContext(context.Background()); !errors.Is(err, refused) {
			t.Fatalf("got %v, want the connect error", err)
		}
	})
	t.Run("prepare error", func(t *testing.T) {
		noSuch := errors.New("no such table")
		f := &fakeConnector{kind: modern, prepareErr: noSuch}
		if _, err := f.open(t).PrepareContext(context.Background(), "SELECT x"); !errors.Is(err, noSuch) {
			t.Fatalf("got %v, want the prepare error", err)
		}
	})
	t.Run("begin error", func(t *testing.T) {
		tooMany := errors.New("too many clients")
		f := &fakeConnector{kind: modern, beginErr: tooMany}
		mw := guardedMiddleware(t, f.open(t))
		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); !errors.Is(err, tooMany) {
			t.Fatalf("got %v, want the begin error", err)
		}
		f.wantCalls(t, "c1 begintx Default")
	})
	t.Run("driver", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		if _, ok := idempotent.GuardConnector(f).Driver().(fakeDriver); !ok {
			t.Fatal("Driver() is not the wrapped connector's driver")
		}
	})
}

func TestOpenGuarded(t *testing.T) {
	reset := func(f *fakeConnector) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.log, f.opened, f.connectors = nil, 0, 0
	}
	use := func(t *testing.T, db *sql.DB) {
		t.Helper()
		t.Cleanup(func() { _ = db.Close() })
		if _, err := db.Exec("UPDATE x"); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("driver without DriverContext", func(t *testing.T) {
		reset(dsnConns)
		db, err := idempotent.OpenGuarded("idempotent-unit-dsn", "dsn-1")
		if err != nil {
			t.Fatal(err)
		}
		use(t, db)
		dsnConns.wantCalls(t, "open dsn-1", "c1 execctx UPDATE x []")
		if _, ok := db.Driver().(dsnDriver); !ok {
			t.Fatalf("Driver() is %T, want the registered driver", db.Driver())
		}
	})
	t.Run("driver with DriverContext", func(t *testing.T) {
		reset(ctxConns)
		db, err := idempotent.OpenGuarded("idempotent-unit-ctx", "dsn-2")
		if err != nil {
			t.Fatal(err)
		}
		use(t, db)
		// database/sql's Open makes one connector to find the driver; the
		// guard makes its own.
		ctxConns.wantCalls(t, "connector dsn-2", "connector dsn-2", "c1 execctx UPDATE x []")
	})
	for _, dsn := range []string{"bad", "bad-second"} {
		t.Run("connector error/"+dsn, func(t *testing.T) {
			reset(ctxConns)
			if _, err := idempotent.OpenGuarded("idempotent-unit-ctx", dsn); err == nil || !strings.Contains(err.Error(), `open "idempotent-unit-ctx": bad dsn`) {
				t.Fatalf("got %v, want the connector's error", err)
			}
		})
	}
	t.Run("unknown driver", func(t *testing.T) {
		if _, err := idempotent.OpenGuarded("idempotent-unit-none", "x"); err == nil || !strings.Contains(err.Error(), `"idempotent-unit-none"`) {
			t.Fatalf("got %v, want an error naming the driver", err)
		}
	})
}

// TestGuardRefusesTransactionControl runs transaction-control statements
// through the claim's own transaction: those that would end it never reach
// the driver, and the delivery rolls back with ErrAutocommit; a savepoint
// rollback is the handler's business and passes.
func TestGuardRefusesTransactionControl(t *testing.T) {
	for _, q := range []string{"COMMIT", "/* done */ commit work", "END", "ROLLBACK", "START TRANSACTION"} {
		t.Run(q, func(t *testing.T) {
			f := &fakeConnector{kind: modern}
			mw := guardedMiddleware(t, f.open(t))
			var stmtErr error
			_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
				_, stmtErr = tx.ExecContext(ctx, q)
				return nil // the handler ignores the error
			})
			if !errors.Is(stmtErr, idempotent.ErrAutocommit) || !errors.Is(err, idempotent.ErrAutocommit) {
				t.Fatalf("statement got %v, delivery got %v; want ErrAutocommit for both", stmtErr, err)
			}
			f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 rollback")
		})
	}
	t.Run("savepoint", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		mw := guardedMiddleware(t, f.open(t))
		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT before_credit")
			return err
		})
		if err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 execctx ROLLBACK TO SAVEPOINT before_credit []", "c1 commit")
	})
}
