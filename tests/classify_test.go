package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// TestClassifyRealErrors feeds the Postgres dialect's Classify errors that
// the server and each driver really produce.
func TestClassifyRealErrors(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 4)
			mon := openMonitor(t)
			schema := tempSchema(t, mon)
			q := pq.QuoteIdentifier(schema)
			if _, err := mon.Exec("CREATE TABLE " + q + ".r (id int PRIMARY KEY, v int NOT NULL); INSERT INTO " + q + ".r VALUES (1, 0), (2, 0)"); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			d := postgres.New()
			cases := []struct {
				name string
				make func(t *testing.T) error
				want dialect.Class
			}{
				{"write skew", func(t *testing.T) error { return writeSkew(t, db, q) }, dialect.Class{Kind: dialect.KindSerialization, Code: "40001"}},
				{"deadlock", func(t *testing.T) error { return deadlock(t, db, mon, q) }, dialect.Class{Kind: dialect.KindSerialization, Code: "40P01"}},
				{"lock timeout", func(t *testing.T) error { return lockTimeout(t, db, q) }, dialect.Class{Kind: dialect.KindLockTimeout, Code: "55P03"}},
				{"undefined table", func(t *testing.T) error {
					_, err := db.ExecContext(ctx, "SELECT * FROM "+q+".missing")
					return err
				}, dialect.Class{Kind: dialect.KindUndefinedTable, Code: "42P01"}},
				{"terminated backend", func(t *testing.T) error { return terminated(t, db, mon) }, dialect.Class{Kind: dialect.KindConnection, Code: "57P01"}},
				{"statement completion unknown", func(t *testing.T) error {
					_, err := db.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'unknown' USING ERRCODE = '40003'; END $$`)
					return err
				}, dialect.Class{Kind: dialect.KindOther, Code: "40003"}},
				{"unique violation", func(t *testing.T) error {
					_, err := db.ExecContext(ctx, "INSERT INTO "+q+".r VALUES (1, 0)")
					return err
				}, dialect.Class{Kind: dialect.KindOther, Code: "23505"}},
				{"statement timeout", func(t *testing.T) error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback() //nolint:errcheck
					if _, err := tx.ExecContext(ctx, "SET LOCAL statement_timeout = 1"); err != nil {
						t.Fatal(err)
					}
					_, err = tx.ExecContext(ctx, "SELECT pg_sleep(1)")
					return err
				}, dialect.Class{Kind: dialect.KindOther, Code: "57014"}},
				{"lost COMMIT", func(t *testing.T) error { return lostCommit(t, drv) }, dialect.Class{Kind: dialect.KindConnection}},
				{"connection refused", func(t *testing.T) error { return refused(t, drv) }, dialect.Class{Kind: dialect.KindConnection}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					err := c.make(t)
					if err == nil {
						t.Fatal("no error produced")
					}
					got, want := d.Classify(err), c.want
					if c.name == "terminated backend" && drv == "pq" {
						// lib/pq turns a FATAL server error into
						// driver.ErrBadConn and drops its SQLSTATE.
						want.Code = ""
					}
					if got != want {
						t.Errorf("Classify(%T %v) = %+v, want %+v", err, err, got, want)
					}
					// Wrapped, as the middleware wraps it, the class is the same.
					if w := d.Classify(fmt.Errorf("idempotent: claim: %w", err)); w.Kind != c.want.Kind {
						t.Errorf("wrapped: %+v, want kind %v", w, c.want.Kind)
					}
				})
			}
		})
	}
}

// writeSkew produces a real 40001: two SERIALIZABLE transactions each read
// both rows and write one.
func writeSkew(t *testing.T, db *sql.DB, q string) error {
	t.Helper()
	ctx := context.Background()
	serializable := &sql.TxOptions{Isolation: sql.LevelSerializable}
	tx1, err := db.BeginTx(ctx, serializable)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback() //nolint:errcheck
	tx2, err := db.BeginTx(ctx, serializable)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback() //nolint:errcheck
	var sum int
	for _, tx := range []*sql.Tx{tx1, tx2} {
		if err := tx.QueryRowContext(ctx, "SELECT sum(v) FROM "+q+".r").Scan(&sum); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx1.ExecContext(ctx, "UPDATE "+q+".r SET v = v + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := tx2.ExecContext(ctx, "UPDATE "+q+".r SET v = v + 1 WHERE id = 2"); err != nil {
		return err
	}
	return tx2.Commit()
}

// deadlock produces a real 40P01: two transactions lock two rows in
// opposite orders.
func deadlock(t *testing.T, db, mon *sql.DB, q string) error {
	t.Helper()
	ctx := context.Background()
	var txs [2]*sql.Tx
	for i := range txs {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck
		if superuser(t, mon) {
			if _, err := tx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '20ms'"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+q+".r SET v = v + 1 WHERE id = $1", i+1); err != nil {
			t.Fatal(err)
		}
		txs[i] = tx
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, tx := range txs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = tx.ExecContext(ctx, "UPDATE "+q+".r SET v = v + 1 WHERE id = $1", 2-i)
			if errs[i] == nil {
				errs[i] = tx.Rollback() // let the other one go
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return errors.New("no deadlock")
}

// lockTimeout produces a real 55P03: a row lock wait beyond lock_timeout.
func lockTimeout(t *testing.T, db *sql.DB, q string) error {
	t.Helper()
	ctx := context.Background()
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if _, err := holder.ExecContext(ctx, "SELECT * FROM "+q+".r WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, postgres.New().LockTimeoutSQL(10e6)); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, "UPDATE "+q+".r SET v = 0 WHERE id = 1")
	return err
}

// terminated produces the error a driver reports when its backend is
// killed with pg_terminate_backend (57P01) inside a transaction.
func terminated(t *testing.T, db, mon *sql.DB) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	pid, err := backendPID(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	terminate(t, mon, pid)
	_, err = tx.ExecContext(ctx, "SELECT 1")
	return err
}

// lostCommit produces the error of a COMMIT whose answer never arrived.
func lostCommit(t *testing.T, drv string) error {
	t.Helper()
	proxy := newCommitCutter(t, dsnHost(t, pgDSN))
	db := openGuardedDSN(t, drv, dsnWithHost(t, pgDSN, proxy.Addr()), 1)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}
	proxy.Arm()
	return tx.Commit()
}

// refused produces the error of connecting to a port nobody listens on.
func refused(t *testing.T, drv string) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	db := openGuardedDSN(t, drv, dsnWithHost(t, pgDSN, addr)+"&connect_timeout=5", 1)
	_, err = db.Begin()
	return err
}

// superuser reports whether the test role may set superuser-only settings
// such as deadlock_timeout.
func superuser(t testing.TB, mon *sql.DB) bool {
	t.Helper()
	var s string
	if err := mon.QueryRow("SELECT current_setting('is_superuser')").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s == "on"
}
