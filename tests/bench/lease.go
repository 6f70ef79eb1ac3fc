package main

import (
	"context"
	"database/sql"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// addLeaseOps adds to e the lib/pq operations the retention fence is
// measured with: ProcessMessage with an event time (the horizon read in
// the claim), the same WithHorizonLease, and the guide's hand-written
// claim and effect, on a lib/pq pool of workers connections to dsn.
func addLeaseOps(ctx context.Context, e *pgxEnv, dsn, table string, workers int, claimSQL, upd, ins string, next func() (string, int64, int64)) error {
	pq, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	pq.SetMaxOpenConns(workers)
	pq.SetMaxIdleConns(workers)
	e.pq = pq
	plain, err := idempotent.New(pq, postgres.New(), "loyalty", idempotent.WithTable(table))
	if err != nil {
		return err
	}
	leased, err := idempotent.New(pq, postgres.New(), "loyalty", idempotent.WithTable(table), idempotent.WithHorizonLease(time.Minute))
	if err != nil {
		return err
	}
	effect := func(ctx context.Context, tx *sql.Tx, cid, oid int64) error {
		if _, err := tx.ExecContext(ctx, upd, cid); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, ins, cid, oid)
		return err
	}
	withEventTime := func(m *idempotent.Middleware) func(context.Context) error {
		return func(ctx context.Context) error {
			k, oid, cid := next()
			_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k, EventTime: time.Now()}, func(ctx context.Context, tx *sql.Tx) error {
				return effect(ctx, tx, cid, oid)
			})
			return err
		}
	}
	e.pqEvent, e.pqLeased = withEventTime(plain), withEventTime(leased)
	e.pqHandwritten = func(ctx context.Context) error {
		k, oid, cid := next()
		tx, err := pq.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, claimSQL, "loyalty", k)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		if err := effect(ctx, tx, cid, oid); err != nil {
			return err
		}
		return tx.Commit()
	}
	return nil
}
