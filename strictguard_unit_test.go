package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// TestStrictGuardOnTheErrorPath: when the handler fails, the strict guard
// reads the transaction id once more; if the session left the claim's
// transaction (an implicit commit), the error says the claim committed
// without its full effect and matches ErrAutocommit.
func TestStrictGuardOnTheErrorPath(t *testing.T) {
	txid := func(id string) *sqlmock.Rows { return sqlmock.NewRows([]string{"txid"}).AddRow(id) }
	failing := func(ctx context.Context, tx *sql.Tx) error {
		if err := effect(ctx, tx); err != nil {
			return err
		}
		return errHandler
	}
	t.Run("committed behind our back", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("0"))
		r.mock.ExpectRollback()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, failing)
		if !errors.Is(err, idempotent.ErrAutocommit) || !errors.Is(err, errHandler) || !strings.Contains(err.Error(), "CLAIM COMMITTED WITHOUT ITS FULL EFFECT") {
			t.Fatalf("got %v, want ErrAutocommit saying the claim committed, and the handler's error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "ROLLBACK")
	})
	t.Run("still in the transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		r.mock.ExpectRollback()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, failing)
		if !errors.Is(err, errHandler) || errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got %v, want the handler's error alone", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "ROLLBACK")
	})
	t.Run("deadlock is retried, not checked", func(t *testing.T) {
		// A deadlock rolls the whole transaction back on MariaDB, where
		// @@in_transaction then reads 0: no false alarm, a retry.
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		deadlock := &pq.Error{Code: "40P01"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		r.mock.ExpectExec(effectSQL).WillReturnError(deadlock)
		// The probe finds the transaction aborted: the deadlock was its own.
		expectProbe(r.mock, &pq.Error{Code: "25P02"})
		r.mock.ExpectRollback()
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("732"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("732"))
		r.mock.ExpectCommit()

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied after one retry", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, dialect.ProbeSavepointSQL, "ROLLBACK", "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "COMMIT")
	})
	t.Run("id unreadable", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnError(errors.New("current transaction is aborted"))
		r.mock.ExpectRollback()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, failing)
		if !errors.Is(err, errHandler) || errors.Is(err, idempotent.ErrAutocommit) || strings.Contains(err.Error(), "aborted") {
			t.Fatalf("got %v, want the handler's error alone: an unreadable id proves nothing", err)
		}
	})
}
