package idempgx_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect/dialecttest"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// TestMatrix runs the conformance suite's matrix on pgx: every mode, every
// claim, retention and edge scenario and every handler mistake, through
// idempgx's Middleware and its pgx.Tx, checked in the database through
// pgx's database/sql driver.
func TestMatrix(t *testing.T) {
	d := dsn(t)
	cfg, err := pgx.ParseConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	dialecttest.Exercise(t, dialecttest.Harness{
		Dialect: postgres.New(),
		Open:    func(testing.TB) (*sql.DB, error) { return stdlib.OpenDB(*cfg), nil },
		Table: func(t testing.TB, db *sql.DB) string {
			name := testenv.UniqueName("t")
			if _, err := db.Exec("CREATE SCHEMA " + name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := db.Exec("DROP SCHEMA " + name + " CASCADE"); err != nil {
					t.Errorf("drop schema %s: %v", name, err)
				}
			})
			return name + ".claims"
		},
		MaxConns:          16,
		LateDeadlockCheck: "SET LOCAL deadlock_timeout = '1min'",
		ProcessedAt: func(t time.Time) string {
			return "'" + t.UTC().Format("2006-01-02 15:04:05.000Z") + "'::timestamptz"
		},
	}, dialecttest.Driver[pgx.Tx]{
		Name:       "pgx",
		Checked:    true,
		RefusesEnd: true,
		New: func(t testing.TB, c dialecttest.Config) (dialecttest.Deliverer[pgx.Tx], error) {
			pool := newPool(t, 16)
			m, err := idempgx.New(pool, c.Consumer, matrixOptions(c)...)
			if err != nil {
				return nil, err
			}
			if err := m.EnsureSchema(context.Background()); err != nil {
				t.Fatalf("EnsureSchema: %v", err)
			}
			return pgxDeliverer{m: m, pool: pool}, nil
		},
		Lacks: func(m dialecttest.Mode) string {
			if m.StrictGuard {
				return "idempgx has no WithStrictGuard: its pgx.Tx refuses Commit and Rollback, and the connection's transaction status is read before every COMMIT, in every mode"
			}
			return ""
		},
		Exec: func(ctx context.Context, tx pgx.Tx, query string) error {
			_, err := tx.Exec(ctx, query)
			return err
		},
		QueryInt: func(ctx context.Context, tx pgx.Tx, query string) (int64, error) {
			var n int64
			err := tx.QueryRow(ctx, query).Scan(&n)
			return n, err
		},
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		Identity: func(tx pgx.Tx) any { return tx.Conn() },
		KillSession: func(t testing.TB, tx pgx.Tx, admin *sql.DB) {
			t.Helper()
			var pid int64
			if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			testenv.TerminatePostgres(t, admin, pid)
		},
	})
}

// matrixOptions returns idempgx's options for the matrix's configuration.
func matrixOptions(c dialecttest.Config) []idempgx.Option {
	opts := []idempgx.Option{idempgx.WithTable(c.Table)}
	if c.Mode.Partitioned {
		opts = append(opts, idempgx.WithDailyPartitions(1))
	}
	if c.Retention > 0 {
		opts = append(opts, idempgx.WithRetention(c.Retention))
	}
	if c.Clock != nil {
		opts = append(opts, idempgx.WithClock(c.Clock))
	}
	if c.Retry != nil {
		opts = append(opts, idempgx.WithRetry(*c.Retry))
	}
	if c.Mode.Coalesced {
		opts = append(opts, idempgx.WithCoalescing(c.Coalescing()))
	}
	if c.Mode.PreCheck {
		opts = append(opts, idempgx.WithSeen(c.Seen))
	}
	if c.LockTimeout > 0 {
		opts = append(opts, idempgx.WithLockTimeout(c.LockTimeout))
	}
	return opts
}

// pgxDeliverer is the matrix's Deliverer of an idempgx Middleware.
type pgxDeliverer struct {
	m    *idempgx.Middleware
	pool *pgxpool.Pool
}

func (p pgxDeliverer) ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(context.Context, pgx.Tx) error) (idempotent.Outcome, error) {
	return p.m.ProcessMessage(ctx, msg, fn)
}

func (p pgxDeliverer) ProcessMessages(ctx context.Context, msgs []idempotent.Message, fn func(context.Context, pgx.Tx, []int) error) ([]idempotent.Outcome, error) {
	return p.m.ProcessMessages(ctx, msgs, fn)
}

func (p pgxDeliverer) PoolExec(ctx context.Context, query string) error {
	_, err := p.pool.Exec(ctx, query)
	return err
}
