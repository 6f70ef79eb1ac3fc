package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// implicitDialect is the Postgres dialect made to say that its database
// commits CREATE implicitly, as MySQL's does.
type implicitDialect struct{ *postgres.Dialect }

func (implicitDialect) CommitsImplicitly(q string) bool {
	return strings.HasPrefix(strings.TrimSpace(q), "CREATE")
}

// TestGuardRefusesImplicitCommits: with a dialect.ImplicitCommitter, the
// guard refuses a statement it names before it reaches the driver, in
// Process and in RunTx; EnsureSchema's own DDL still runs; and a dialect
// without it lets the statement through.
func TestGuardRefusesImplicitCommits(t *testing.T) {
	ctx := context.Background()
	ddl := "CREATE TABLE scratch (id int)"
	d := implicitDialect{postgres.New()}
	t.Run("Process", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		mw, err := idempotent.New(f.open(t), d, consumer, noWait)
		if err != nil {
			t.Fatal(err)
		}
		var stmtErr error
		_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
			_, stmtErr = tx.ExecContext(ctx, ddl)
			return nil // the handler ignores the error
		})
		if !errors.Is(stmtErr, idempotent.ErrAutocommit) || !errors.Is(err, idempotent.ErrAutocommit) || !strings.Contains(err.Error(), "commits implicitly") {
			t.Fatalf("statement got %v, delivery got %v; want ErrAutocommit for both", stmtErr, err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 execctx "+claimSQL+" "+claimArgs, "c1 rollback")
	})
	t.Run("RunTx", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		err := idempotent.RunTx(ctx, f.open(t), d, nil, idempotent.DefaultRetryPolicy(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, ddl)
			return err
		})
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("RunTx = %v, want ErrAutocommit", err)
		}
		f.wantCalls(t, "c1 begintx Default", "c1 rollback")
	})
	t.Run("not an ImplicitCommitter", func(t *testing.T) {
		f := &fakeConnector{kind: modern}
		mw := guardedMiddleware(t, f.open(t))
		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, ddl)
			return err
		})
		if err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied: Postgres DDL is transactional", got, err)
		}
	})
}
