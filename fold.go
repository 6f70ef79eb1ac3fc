package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
)

func init() { claimfold.Register(newFold) }

// newFold is the claimfold.Builder: it folds m's claim statement with an
// adapter's companion statement when m's dialect is a dialect.ClaimFolder.
func newFold(mw any, companion func(first int) string) (*claimfold.Fold, bool) {
	m, ok := mw.(*Middleware)
	if !ok || m == nil {
		return nil, false
	}
	f, ok := m.d.(dialect.ClaimFolder)
	if !ok {
		return nil, false
	}
	first := 3 // consumer, key
	if m.ret.part != nil {
		first = 4 // and the event day
	}
	q := f.FoldClaimSQL(m.claimSQL, companion(first))
	if q == "" {
		return nil, false
	}
	return claimfold.Make(q, m.foldedClaim), true
}

// foldedClaim is claimMessage — the same checks, lock timeout and error
// wrapping, through claimWith — with the claim statement replaced by stmt,
// the prepared folded statement, which also runs the companion with args.
// It returns the companion's row count and whether the claim was new.
func (m *Middleware) foldedClaim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error) {
	if tx == nil || stmt == nil {
		return 0, false, errors.New("idempotent: Claim: nil transaction or statement")
	}
	if err := m.checkMessage(Message{Key: key, EventTime: at}, eventTimeOptional); err != nil {
		return 0, false, err
	}
	var companion int64
	claimed, err := m.claimWith(ctx, tx, nil, func() (bool, error) {
		a := make([]any, 0, 3+len(args))
		a = append(a, m.consumerArg, key)
		if m.ret.part != nil {
			a = append(a, eventDay(at).Format(time.DateOnly))
		}
		a = append(a, args...)
		var n int64
		if err := tx.StmtContext(ctx, stmt).QueryRowContext(ctx, a...).Scan(&companion, &n); err != nil {
			if rerr := m.retentionClaimError(ctx, tx, err, nil, at); rerr != nil {
				return false, rerr
			}
			return false, m.claimError(err)
		}
		if n == 1 && m.hk != nil && !at.IsZero() {
			// The folded statement does not read the horizon: read it
			// after the insert, as a dialect without HorizonClaimer does.
			if _, err := m.checkHorizonAfterClaim(ctx, tx, []string{key}, []time.Time{at}); err != nil {
				return false, err
			}
		}
		return n == 1, nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	return companion, claimed, nil
}
