// Package claimfold lets this repository's adapters run a data-modifying
// statement of their own — a companion, such as the Kafka consumer's offset
// advance — in the same statement as an idempotent.Middleware's claim, where
// the Middleware's dialect can fold the two (dialect.ClaimFolder): one round
// trip to the database instead of two.
//
// It is internal on purpose: the hook reaches into the Middleware, and only
// this repository's packages, which know what their companion statements do
// to the claim's transaction, may use it. Package idempotent registers the
// implementation when it is initialised; an adapter that imports
// idempotent can therefore always call New.
package claimfold

import (
	"context"
	"database/sql"
	"time"
)

// Fold is a Middleware's claim folded with one companion statement. Its
// zero value is not usable; New returns one.
type Fold struct {
	// SQL is the folded statement. The caller prepares it on the database
	// its transactions come from (once per connection, as a *sql.Stmt of
	// that database) and passes it to Claim.
	SQL string

	claim func(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error)
}

// Claim claims the message with key and event time at (zero when unknown)
// in tx, exactly as the Middleware's ClaimMessage does — the same checks of
// the key and event time before any statement, the same lock timeout, the
// same claim statement and partition, the same errors — except that the
// claim statement is stmt, the prepared Fold.SQL, which also runs the
// companion with args. It reports the number of rows the companion affected
// and whether the claim was new. Like ClaimMessage it neither commits nor
// retries; an error from stmt leaves tx to be rolled back. An error of the
// statement is wrapped as a claim error even when it concerns the
// companion's table: the caller tells the two apart if it must.
func (f *Fold) Claim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args ...any) (companion int64, claimed bool, err error) {
	return f.claim(ctx, tx, stmt, key, at, args)
}

// Builder builds a Fold for a Middleware. Package idempotent registers it.
type Builder func(mw any, companion func(first int) string) (*Fold, bool)

var builder Builder

// Register installs package idempotent's Builder. Only that package calls
// it, from its init function.
func Register(b Builder) { builder = b }

// Make returns a Fold carrying claim, for package idempotent's Builder.
func Make(sql string, claim func(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error)) *Fold {
	return &Fold{SQL: sql, claim: claim}
}

// New folds mw's claim (mw is an *idempotent.Middleware) with a companion
// statement: companion returns it with its parameters numbered from first
// ($first, $first+1, … in Postgres). It reports false when the Middleware's
// dialect cannot fold (it has no dialect.ClaimFolder, or refuses these
// statements): the caller then runs the companion and the claim one after
// the other.
func New(mw any, companion func(first int) string) (*Fold, bool) {
	if builder == nil || companion == nil {
		return nil, false
	}
	return builder(mw, companion)
}
