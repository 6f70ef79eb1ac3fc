package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// The handler's edges: what the middleware retries when a handler fails,
// and the transactions a handler must not begin.

// pools are the two ways a driver-sensitive test opens the database:
// through GuardConnector and without it.
var pools = []string{"guarded", "plain"}

// openPool opens the test database with driver drv ("pq" or "pgx"),
// through GuardConnector when pool is "guarded", with at most maxConns
// connections. It is closed in Cleanup after a leak check.
func openPool(t testing.TB, drv, pool string, maxConns int) *sql.DB {
	t.Helper()
	if pool == "guarded" {
		return openGuarded(t, drv, maxConns)
	}
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	db := sql.OpenDB(connector(t, drv, pgDSN))
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// refusedDial returns the error of a TCP dial to a port nothing listens
// on: the *net.OpError a handler gets from a service that is down.
func refusedDial(t testing.TB) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	conn, err := net.Dial("tcp", addr)
	if err == nil {
		_ = conn.Close()
		t.Fatalf("dial %s succeeded after its listener closed", addr)
	}
	return err
}

// A handler's own failure — an empty response body (io.EOF), a refused
// connection to another service (*net.OpError), a serialization failure
// from another database session, its own statement timeout — is returned at
// once, wrapped: the handler runs once, nothing is committed, and nothing
// is retried, though the dialect classifies each as retryable.
func TestHandlerOwnFailureNotRetried(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// fail returns the handler's failure; it may use tx and ctx.
		fail  func(t *testing.T, ctx context.Context, tx *sql.Tx, other *sql.DB, q string) error
		match func(err error) bool
	}{
		{"io.EOF", func(*testing.T, context.Context, *sql.Tx, *sql.DB, string) error {
			var reply struct{ OK bool }
			return json.NewDecoder(strings.NewReader("")).Decode(&reply)
		}, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"net.OpError", func(t *testing.T, _ context.Context, _ *sql.Tx, _ *sql.DB, _ string) error {
			return fmt.Errorf("call the points service: %w", refusedDial(t))
		}, func(err error) bool { var ne *net.OpError; return errors.As(err, &ne) }},
		{"foreign 40001", func(t *testing.T, _ context.Context, _ *sql.Tx, other *sql.DB, q string) error {
			return writeSkew(t, other, q)
		}, func(err error) bool { return sqlState(err) == "40001" }},
		{"own deadline", func(_ *testing.T, ctx context.Context, tx *sql.Tx, _ *sql.DB, _ string) error {
			qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := tx.ExecContext(qctx, "SELECT pg_sleep(30)")
			return err
		}, func(err error) bool { return err != nil }},
	}
	for _, drv := range drivers {
		for _, pool := range pools {
			for _, c := range cases {
				t.Run(drv+"/"+pool+"/"+c.name, func(t *testing.T) {
					t.Parallel()
					db := openPool(t, drv, pool, 2)
					other := openMonitor(t)
					rec := &recorder{}
					l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(10)), idempotent.WithObserver(rec))
					q := pq.QuoteIdentifier(l.schema)
					if _, err := other.Exec("CREATE TABLE " + q + ".r (id int PRIMARY KEY, v int NOT NULL); INSERT INTO " + q + ".r VALUES (1, 0), (2, 0)"); err != nil {
						t.Fatal(err)
					}
					msg := orderCompleted{OrderID: 71, CustomerID: 7, TotalCents: 7100}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					calls := 0
					var own error
					_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
						calls++
						if err := l.credit(ctx, tx, msg); err != nil {
							return err
						}
						own = c.fail(t, ctx, tx, other, q)
						return own
					})
					t.Logf("handler ran %d times; its error %v (%T); Process: %v", calls, own, own, err)
					if own == nil || !c.match(own) {
						t.Fatalf("the case did not produce its failure: %v", own)
					}
					if err == nil || !c.match(err) {
						t.Fatalf("Process = %v, want the handler's error wrapped", err)
					}
					if !errors.Is(err, own) {
						t.Errorf("Process error %q does not wrap the handler's %q", err, own)
					}
					if errors.Is(err, idempotent.ErrRetriesExhausted) || calls != 1 || len(rec.retryReasons()) != 0 {
						t.Errorf("handler ran %d times with retries %v (%v); want once, no retry", calls, rec.retryReasons(), err)
					}
					if n := claims(t, other, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
						t.Errorf("%d claims, want 0", n)
					}
					if b := l.balance(t, msg.CustomerID); b != 0 {
						t.Errorf("balance %d, want 0", b)
					}
					if drv == "pgx" && c.name == "own deadline" && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("pgx: %v does not match context.DeadlineExceeded", err)
					}
				})
			}
		}
	}
}

// The claim's own transaction's failures are still retried, with and
// without GuardConnector, with either driver: a serialization failure or a
// deadlock raised in the transaction, and the loss of its connection.
func TestTransactionFailureRetried(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, reason string
		fail         func(t *testing.T, ctx context.Context, tx *sql.Tx, mon *sql.DB) error
	}{
		{"40001", "serialization", func(_ *testing.T, ctx context.Context, tx *sql.Tx, _ *sql.DB) error { return raise(ctx, tx, "40001") }},
		{"40P01", "serialization", func(_ *testing.T, ctx context.Context, tx *sql.Tx, _ *sql.DB) error {
			return fmt.Errorf("transfer: %w", raise(ctx, tx, "40P01"))
		}},
		{"killed backend", "connection", func(t *testing.T, ctx context.Context, tx *sql.Tx, mon *sql.DB) error {
			pid, err := backendPID(ctx, tx)
			if err != nil {
				return err
			}
			terminate(t, mon, pid)
			_, err = tx.ExecContext(ctx, "SELECT 1")
			return err
		}},
	}
	for _, drv := range drivers {
		for _, pool := range pools {
			for _, c := range cases {
				t.Run(drv+"/"+pool+"/"+c.name, func(t *testing.T) {
					t.Parallel()
					db := openPool(t, drv, pool, 2)
					mon := openMonitor(t)
					rec := &recorder{}
					l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(5)), idempotent.WithObserver(rec))
					msg := orderCompleted{OrderID: 72, CustomerID: 7, TotalCents: 7200}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					calls := 0
					got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
						calls++
						if err := l.credit(ctx, tx, msg); err != nil {
							return err
						}
						if calls == 1 {
							return c.fail(t, ctx, tx, mon)
						}
						return nil
					})
					if err != nil || got != idempotent.Applied || calls != 2 {
						t.Fatalf("(%v, %v) after %d handler runs; want applied after 2", got, err, calls)
					}
					if r := rec.retryReasons(); !slices.Equal(r, []string{c.reason}) {
						t.Errorf("retries %v, want one %s", r, c.reason)
					}
					if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
						t.Errorf("balance %d, want %d", b, pointsFor(msg))
					}
					if n := l.ledgerRows(t, msg.OrderID); n != 1 {
						t.Errorf("%d ledger rows, want 1", n)
					}
				})
			}
		}
	}
}

// nestedWork is a transaction a handler tries to begin with its own
// context: through another Middleware (other), the handler's own (l.mw), or
// RunTx. Each would write a ledger row for order 1000+i.
type nestedWork struct {
	name string
	run  func(ctx context.Context, l *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error
}

var nestedWorks = []nestedWork{
	{"RunTx", func(ctx context.Context, l *loyalty, _ *idempotent.Middleware, _ string, write idempotent.TxFunc) error {
		return idempotent.RunTx(ctx, l.db, postgres.New(), nil, fastRetry(3), write)
	}},
	{"Process/other", func(ctx context.Context, _ *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		_, err := other.ProcessMessage(ctx, idempotent.Message{Key: key}, write)
		return err
	}},
	{"Process/same key", func(ctx context.Context, l *loyalty, _ *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: key}, write)
		return err
	}},
	{"ProcessMessage with an event time", func(ctx context.Context, _ *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		_, err := other.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: time.Now()}, write)
		return err
	}},
	{"ProcessMessages", func(ctx context.Context, _ *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		_, err := other.ProcessMessages(ctx, keyMessages(key), func(ctx context.Context, tx *sql.Tx, _ []int) error { return write(ctx, tx) })
		return err
	}},
	{"ProcessNatural", func(ctx context.Context, _ *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		_, err := other.ProcessNatural(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) (bool, error) { return true, write(ctx, tx) })
		return err
	}},
	{"ProcessMessageTx", func(ctx context.Context, _ *loyalty, other *idempotent.Middleware, key string, write idempotent.TxFunc) error {
		begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
			tx, err := db.BeginTx(ctx, opts)
			return tx, tx, err
		}
		_, err := idempotent.ProcessMessageTx(ctx, other, idempotent.Message{Key: key}, begin, write)
		return err
	}},
}

// A transaction begun inside a handler with the handler's context is
// refused at once with ErrAutocommit, before it takes a connection, and the
// handler's own transaction rolls back, also when the handler swallows the
// error: three deliveries (two failing, the last swallowing the refusal)
// leave no effect at all. The same key nested does
// not wait on its own claim.
func TestNestedTransactionRefused(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, pool := range pools {
			for _, nw := range nestedWorks {
				t.Run(drv+"/"+pool+"/"+nw.name, func(t *testing.T) {
					t.Parallel()
					db := openPool(t, drv, pool, 2)
					l := newLoyalty(t, db)
					other, err := idempotent.New(db, postgres.New(), "audit", idempotent.WithTable(l.schema+".audit_claims"))
					if err != nil {
						t.Fatal(err)
					}
					if err := other.EnsureSchema(context.Background()); err != nil {
						t.Fatal(err)
					}
					q := pq.QuoteIdentifier(l.schema)
					msg := orderCompleted{OrderID: 73, CustomerID: 7, TotalCents: 7300}
					for i := range 3 {
						// The deadline is a safety net: a nested call that
						// waited would end with it, and fail below.
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						var nestedErr error
						_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
							if err := l.credit(ctx, tx, msg); err != nil {
								return err
							}
							nestedErr = nw.run(ctx, l, other, msg.key(), func(ctx context.Context, tx *sql.Tx) error {
								_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES (7, $1, 1)", 1000+i)
								return err
							})
							if i == 2 {
								return nil // the handler swallows the refusal
							}
							return errors.Join(nestedErr, errors.New("the handler fails after the nested work"))
						})
						cancel()
						if i == 0 {
							t.Logf("nested: %v; Process: %v", nestedErr, err)
						}
						if !errors.Is(nestedErr, idempotent.ErrAutocommit) || !strings.Contains(fmt.Sprint(nestedErr), "inside a handler") {
							t.Errorf("delivery %d: nested %s = %v, want ErrAutocommit saying a transaction was begun inside a handler", i+1, nw.name, nestedErr)
						}
						if !errors.Is(err, idempotent.ErrAutocommit) {
							t.Errorf("delivery %d: Process = %v, want ErrAutocommit although the handler swallowed it", i+1, err)
						}
						if errors.Is(err, context.DeadlineExceeded) || errors.Is(nestedErr, context.DeadlineExceeded) {
							t.Fatalf("delivery %d: the nested call waited until the deadline", i+1)
						}
					}
					if n := count(t, db, "SELECT count(*) FROM "+q+".point_ledger"); n != 0 {
						t.Errorf("%d ledger rows after 3 refused deliveries, want 0", n)
					}
					if b := l.balance(t, msg.CustomerID); b != 0 {
						t.Errorf("balance %d, want 0", b)
					}
					for _, table := range []string{"processed_messages", "audit_claims"} {
						if n := count(t, db, "SELECT count(*) FROM "+q+"."+table); n != 0 {
							t.Errorf("%d claims in %s, want 0", n, table)
						}
					}
					if n := db.Stats().InUse; n != 0 {
						t.Errorf("%d connections in use after the deliveries, want 0", n)
					}
				})
			}
		}
	}
}

// On a pool of one connection, held by the handler's transaction, a nested
// RunTx is refused without waiting for a connection.
func TestNestedTransactionTakesNoConnection(t *testing.T) {
	t.Parallel()
	for _, pool := range pools {
		t.Run(pool, func(t *testing.T) {
			t.Parallel()
			db := openPool(t, "pq", pool, 1)
			l := newLoyalty(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var nestedErr error
			_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "nested-one-conn"}, func(ctx context.Context, tx *sql.Tx) error {
				nestedErr = idempotent.RunTx(ctx, db, postgres.New(), nil, fastRetry(1), func(context.Context, *sql.Tx) error { return nil })
				return nestedErr
			})
			t.Logf("nested: %v; Process: %v", nestedErr, err)
			if !errors.Is(nestedErr, idempotent.ErrAutocommit) || errors.Is(nestedErr, context.DeadlineExceeded) {
				t.Errorf("nested RunTx = %v, want ErrAutocommit at once", nestedErr)
			}
			if !errors.Is(err, idempotent.ErrAutocommit) {
				t.Errorf("Process = %v, want ErrAutocommit", err)
			}
			if s := db.Stats(); s.InUse != 0 || s.WaitCount != 0 {
				t.Errorf("pool after the delivery: %d in use, %d waits for a connection; want 0, 0", s.InUse, s.WaitCount)
			}
		})
	}
}

// Independent work inside a handler runs on a context that does not derive
// from the handler's, such as context.Background(): it commits on its own,
// whatever becomes of the handler's transaction. context.WithoutCancel keeps
// the handler's values, the claim's among them, so it is refused.
func TestIndependentWorkOnBackgroundContext(t *testing.T) {
	t.Parallel()
	db := openPool(t, "pq", "guarded", 2)
	l := newLoyalty(t, db)
	q := pq.QuoteIdentifier(l.schema)
	var nestedErr error
	_, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: "without-cancel"}, func(ctx context.Context, tx *sql.Tx) error {
		nestedErr = idempotent.RunTx(context.WithoutCancel(ctx), db, postgres.New(), nil, fastRetry(1), func(context.Context, *sql.Tx) error { return nil })
		return nil
	})
	if !errors.Is(nestedErr, idempotent.ErrAutocommit) || !errors.Is(err, idempotent.ErrAutocommit) {
		t.Errorf("RunTx on context.WithoutCancel(handler's) = %v, and Process = %v; want ErrAutocommit for both", nestedErr, err)
	}
	var detachedErr error
	handlerFailed := errors.New("the handler fails afterwards")
	_, err = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: "independent"}, func(ctx context.Context, tx *sql.Tx) error {
		detachedErr = idempotent.RunTx(context.Background(), db, postgres.New(), nil, fastRetry(1), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES (7, 74, 1)")
			return err
		})
		return handlerFailed
	})
	if !errors.Is(err, handlerFailed) || errors.Is(err, idempotent.ErrAutocommit) {
		t.Fatalf("Process = %v, want the handler's own failure only", err)
	}
	if detachedErr != nil {
		t.Fatalf("RunTx on context.Background() = %v", detachedErr)
	}
	if n := l.ledgerRows(t, 74); n != 1 {
		t.Errorf("%d rows from the independent work, want 1: it commits on its own", n)
	}
}

// ProcessMessages with WithLockTimeout on MariaDB restores the session's
// innodb_lock_wait_timeout after its claim, as Process does: the handler's
// own waits and the pooled connection afterwards keep the session's value.
func TestBatchRestoresLockTimeoutMySQL(t *testing.T) {
	t.Parallel()
	cfg, err := gomysql.ParseDSN(mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "7"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // every statement on the same session
	t.Cleanup(func() { closeChecked(t, db) })
	ctx := context.Background()
	table := uniqueName("t")
	t.Cleanup(func() {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	mw, err := idempotent.New(db, mysql.New(), "batch", idempotent.WithTable(table), idempotent.WithLockTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	session := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (int, error) {
		var n int
		err := q.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&n)
		return n, err
	}
	var inside int
	outs, err := mw.ProcessMessages(ctx, keyMessages("b", "a"), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		n, err := session(tx)
		inside = n
		return err
	})
	if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Applied}) {
		t.Fatalf("ProcessMessages = %v, %v", outs, err)
	}
	after, err := session(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("innodb_lock_wait_timeout: %d in the batch handler, %d on the pooled connection afterwards (session's own 7, claim's 2)", inside, after)
	if inside != 7 {
		t.Errorf("inside the batch handler innodb_lock_wait_timeout is %d, want the session's 7", inside)
	}
	if after != 7 {
		t.Errorf("after the batch the pooled session's innodb_lock_wait_timeout is %d, want 7 restored", after)
	}
}

// mysqlDeadlock provokes a real deadlock (error 1213) between two sessions
// of db, on a table of its own, and returns it.
func mysqlDeadlock(t testing.TB, db *sql.DB) error {
	t.Helper()
	ctx := context.Background()
	table := uniqueName("dl")
	if _, err := db.Exec("CREATE TABLE " + table + " (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
	if _, err := db.Exec("INSERT INTO " + table + " VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	var txs [2]*sql.Tx
	for i := range txs {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck
		if _, err := tx.Exec(fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE id = %d", table, i+1)); err != nil {
			t.Fatal(err)
		}
		txs[i] = tx
	}
	// Each holds one row and asks for the other's: whichever asks second
	// closes the cycle, and InnoDB rolls one of them back at once.
	first := make(chan error, 1)
	go func() {
		_, err := txs[0].Exec("UPDATE " + table + " SET v = v + 1 WHERE id = 2")
		first <- err
	}()
	_, second := txs[1].Exec("UPDATE " + table + " SET v = v + 1 WHERE id = 1")
	if second != nil {
		_ = txs[1].Rollback() // the victim; the first goes on
		if err := <-first; err != nil {
			t.Fatalf("after the second session's %v, the first failed too: %v", second, err)
		}
		return second
	}
	return <-first
}

// MariaDB: a deadlock the handler meets between two other sessions is
// returned at once; the claim's transaction is alive. (A deadlock of the
// claim's own transaction is retried: the conformance suite's Deadlock
// check.)
func TestHandlerForeignDeadlockNotRetriedMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDSN(t)
	open := func() *sql.DB {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(3)
		t.Cleanup(func() { closeChecked(t, db) })
		return db
	}
	db, other := open(), open()
	ctx := context.Background()
	table, effects := uniqueName("t"), uniqueName("fx")
	t.Cleanup(func() { _, _ = other.Exec("DROP TABLE IF EXISTS " + table + ", " + effects) })
	if _, err := other.Exec("CREATE TABLE " + effects + " (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	mw, err := idempotent.New(db, mysql.New(), "fx", idempotent.WithTable(table), idempotent.WithRetry(fastRetry(10)), idempotent.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	calls := 0
	var own error
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "foreign-deadlock"}, func(ctx context.Context, tx *sql.Tx) error {
		calls++
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+effects+" VALUES (1)"); err != nil {
			return err
		}
		own = mysqlDeadlock(t, other)
		return fmt.Errorf("ledger service: %w", own)
	})
	t.Logf("handler ran %d times; Process: %v", calls, err)
	var me *gomysql.MySQLError
	if !errors.As(own, &me) || me.Number != 1213 {
		t.Fatalf("the provoked error is %v, want a deadlock (1213)", own)
	}
	if !errors.Is(err, own) || calls != 1 || len(rec.retryReasons()) != 0 {
		t.Errorf("Process = %v after %d handler runs and retries %v; want the deadlock at once", err, calls, rec.retryReasons())
	}
	if n := count(t, other, "SELECT COUNT(*) FROM "+effects); n != 0 {
		t.Errorf("%d effect rows, want 0", n)
	}
	if n := count(t, other, "SELECT COUNT(*) FROM "+table); n != 0 {
		t.Errorf("%d claims, want 0", n)
	}
}

// SQLite: the claim's transaction holds the write lock, so a SQLITE_BUSY in
// the handler comes from another connection (here, a write outside the
// transaction that will not wait): it is returned at once, not retried.
func TestHandlerBusyElsewhereNotRetriedSQLite(t *testing.T) {
	t.Parallel()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "edges.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE effects (id INTEGER PRIMARY KEY); CREATE TABLE audit (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	mw, err := idempotent.New(db, sqlite.New(), "fx", idempotent.WithRetry(fastRetry(10)), idempotent.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	calls := 0
	var own error
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "busy-elsewhere"}, func(ctx context.Context, tx *sql.Tx) error {
		calls++
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects VALUES (1)"); err != nil {
			return err
		}
		c, err := db.Conn(context.Background())
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.ExecContext(context.Background(), "PRAGMA busy_timeout = 0"); err != nil {
			return err
		}
		_, own = c.ExecContext(context.Background(), "INSERT INTO audit VALUES (1)")
		// The connection goes back to the pool: give it its wait again.
		if _, err := c.ExecContext(context.Background(), fmt.Sprintf("PRAGMA busy_timeout = %d", sqlite.BusyTimeout.Milliseconds())); err != nil {
			return err
		}
		return own
	})
	t.Logf("handler ran %d times; Process: %v", calls, err)
	if own == nil || sqlite.New().Classify(own).Kind != dialect.KindSerialization {
		t.Fatalf("the write outside the transaction gave %v, want SQLITE_BUSY", own)
	}
	if !errors.Is(err, own) || calls != 1 || len(rec.retryReasons()) != 0 {
		t.Errorf("Process = %v after %d handler runs and retries %v; want the busy error at once", err, calls, rec.retryReasons())
	}
	if n := count(t, db, "SELECT COUNT(*) FROM effects"); n != 0 {
		t.Errorf("%d effect rows, want 0", n)
	}
}
