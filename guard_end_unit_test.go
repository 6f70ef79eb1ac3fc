package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// TestGuardRefusesHandlerEndingTheTransaction: on a guarded connection a
// handler's tx.Commit or tx.Rollback never reaches the driver as such: the
// guard rolls the transaction back and the call fails with ErrAutocommit,
// and so does the delivery, whether the handler returns that error or not;
// nothing is committed.
func TestGuardRefusesHandlerEndingTheTransaction(t *testing.T) {
	ctx := context.Background()
	for _, end := range []string{"Commit", "Rollback"} {
		for _, swallow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/swallowed=%v", end, swallow), func(t *testing.T) {
				f := &fakeConnector{kind: modern}
				mw := guardedMiddleware(t, f.open(t))
				var endErr error
				_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
					if err := effect(ctx, tx); err != nil {
						return err
					}
					if end == "Commit" {
						endErr = tx.Commit()
					} else {
						endErr = tx.Rollback()
					}
					if swallow {
						return nil
					}
					return endErr
				})
				if !errors.Is(endErr, idempotent.ErrAutocommit) || !strings.Contains(endErr.Error(), "tx."+end) {
					t.Errorf("tx.%s returned %v, want ErrAutocommit naming it", end, endErr)
				}
				if !errors.Is(err, idempotent.ErrAutocommit) {
					t.Fatalf("ProcessMessage returned %v, want ErrAutocommit", err)
				}
				if n := strings.Count(err.Error(), "committed or rolled back the transaction itself"); n != 1 {
					t.Errorf("the error states the cause %d times, want once: %v", n, err)
				}
				f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 execctx "+effectSQL+" []", "c1 rollback")
			})
		}
	}
	t.Run("RunTx", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		err := idempotent.RunTx(ctx, f.open(t), pg, nil, idempotent.DefaultRetryPolicy(), func(ctx context.Context, tx *sql.Tx) error {
			if err := effect(ctx, tx); err != nil {
				return err
			}
			_ = tx.Commit()
			return nil
		})
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("RunTx returned %v, want ErrAutocommit", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+effectSQL+" []", "c1 rollback")
	})
	t.Run("database/sql's own rollback when the context ends is not the handler's", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		mw := guardedMiddleware(t, f.open(t))
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := mw.ProcessMessage(cctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) || errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("ProcessMessage returned %v, want context.Canceled alone", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 rollback")
	})
}

// rollbackDialect is the Postgres dialect made to say that its database
// rolls the transaction back when a statement fails with errRolledBack, as
// InnoDB does on a deadlock.
type rollbackDialect struct{ *postgres.Dialect }

// errRolledBack is a deadlock, which the dialect classifies as retryable.
var errRolledBack = &pq.Error{Code: "40P01", Message: "deadlock detected"}

func (rollbackDialect) RollsBackImplicitly(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "40P01"
}

// TestGuardAfterImplicitRollback: with a dialect.ImplicitRollbacker, once a
// handler's statement fails with an error after which the database rolled
// the transaction back, the guard refuses every further statement of the
// attempt, and a handler that swallows it fails with ErrAutocommit instead
// of being reported applied with nothing committed; one that returns it
// gets its own error.
func TestGuardAfterImplicitRollback(t *testing.T) {
	ctx := context.Background()
	const hot = "UPDATE hot SET n = n + 1"
	run := func(t *testing.T, fn idempotent.TxFunc) (*fakeConnector, error) {
		f := &fakeConnector{kind: modern, execErr: func(q string) error {
			if q == hot {
				return errRolledBack
			}
			return nil
		}}
		mw, err := idempotent.New(f.open(t), rollbackDialect{postgres.New()}, consumer, noWait)
		if err != nil {
			t.Fatal(err)
		}
		_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: key}, fn)
		return f, err
	}
	t.Run("swallowed, then another statement", func(t *testing.T) {
		var after error
		f, err := run(t, func(ctx context.Context, tx *sql.Tx) error {
			_, _ = tx.ExecContext(ctx, hot)
			_, after = tx.ExecContext(ctx, effectSQL)
			return nil
		})
		if !errors.Is(after, idempotent.ErrAutocommit) || !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("the statement after got %v, the delivery %v; want ErrAutocommit for both", after, err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 execctx "+hot+" []", "c1 rollback")
	})
	t.Run("swallowed, and nil returned", func(t *testing.T) {
		f, err := run(t, func(ctx context.Context, tx *sql.Tx) error {
			_, _ = tx.ExecContext(ctx, hot)
			return nil
		})
		if !errors.Is(err, idempotent.ErrAutocommit) || !errors.Is(err, errRolledBack) {
			t.Fatalf("the delivery got %v, want ErrAutocommit and the cause", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 execctx "+hot+" []", "c1 rollback")
	})
	t.Run("returned", func(t *testing.T) {
		_, err := run(t, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, hot)
			return err
		})
		if !errors.Is(err, errRolledBack) || errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("the delivery got %v, want the handler's own error", err)
		}
	})
}
