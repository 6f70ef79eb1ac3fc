package dialecttest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/txclaim/idempotent"
)

// The matrix's database/sql column: idempotent.Middleware on the harness's
// database, opened plain (Harness.Open) or through GuardConnector
// (Harness.OpenGuarded).

// sqlDrivers returns the database/sql columns of the harness: plain, and
// guarded where the harness can open the database through GuardConnector.
func sqlDrivers(e *Env) []Driver[*sql.Tx] {
	ds := []Driver[*sql.Tx]{sqlDriver(e, false)}
	if e.h.OpenGuarded != nil {
		ds = append(ds, sqlDriver(e, true))
	}
	return ds
}

func sqlDriver(e *Env, guarded bool) Driver[*sql.Tx] {
	name := "plain"
	if guarded {
		name = "guarded"
	}
	d := Driver[*sql.Tx]{
		Name:    name,
		Guarded: guarded,
		New: func(t testing.TB, c Config) (Deliverer[*sql.Tx], error) {
			t.Helper()
			var db *sql.DB
			if guarded {
				db = e.guardedDB(t)
			} else {
				db = e.DB(t)
			}
			mw, err := idempotent.New(db, e.h.Dialect, c.Consumer, c.Options()...)
			if err != nil {
				return nil, err
			}
			if err := mw.EnsureSchema(context.Background()); err != nil {
				t.Fatalf("EnsureSchema: %v", err)
			}
			return sqlDeliverer{mw: mw, db: db}, nil
		},
		Exec: func(ctx context.Context, tx *sql.Tx, query string) error {
			_, err := tx.ExecContext(ctx, query)
			return err
		},
		QueryInt: func(ctx context.Context, tx *sql.Tx, query string) (int64, error) {
			var n int64
			err := tx.QueryRowContext(ctx, query).Scan(&n)
			return n, err
		},
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		Identity: func(tx *sql.Tx) any { return tx },
	}
	if e.h.KillSession != nil {
		d.KillSession = e.h.KillSession
	}
	return d
}

// sqlDeliverer is the Deliverer of an idempotent.Middleware.
type sqlDeliverer struct {
	mw *idempotent.Middleware
	db *sql.DB
}

func (s sqlDeliverer) ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(context.Context, *sql.Tx) error) (idempotent.Outcome, error) {
	return s.mw.ProcessMessage(ctx, msg, fn)
}

func (s sqlDeliverer) ProcessMessages(ctx context.Context, msgs []idempotent.Message, fn func(context.Context, *sql.Tx, []int) error) ([]idempotent.Outcome, error) {
	return s.mw.ProcessMessages(ctx, msgs, fn)
}

func (s sqlDeliverer) PoolExec(ctx context.Context, query string) error {
	_, err := s.db.ExecContext(ctx, query)
	return err
}
