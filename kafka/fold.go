package kafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
)

// newFold folds the Middleware's claim with the offset advance, when its
// dialect can (the Postgres dialect does): the record transaction then
// sends one statement where it would send two. nil means it cannot.
func newFold(mw *idempotent.Middleware, q kafkaoffsets.Statements) *adapter.Fold {
	f, ok := adapter.NewFold(mw, q.Advance)
	if !ok {
		return nil
	}
	return f
}

// advanceAndClaim is the claim of a record's attempt: it advances the
// stored offset of r's partition from expected to r's offset + 1 (storing
// topicID with it) and claims the record's key, and reports whether the
// claim was new. It returns a *fenceError when the stored offset was
// elsewhere, a *LogGapError when it belongs to another topic ID. With stmt,
// the prepared fold (foldStmt), the advance and the claim are one
// statement; without, two.
func (c *Consumer) advanceAndClaim(ctx context.Context, a *adapter.Attempt, stmt *sql.Stmt, r *kgo.Record, expected int64, topicID string) (bool, error) {
	next := r.Offset + 1
	if stmt == nil {
		return a.ClaimAfter(func() error {
			return c.advanceOffset(ctx, a.Tx(), r.Topic, r.Partition, expected, next, topicID)
		})
	}
	advanced, claimed, err := a.Claim(stmt, c.consumer, r.Topic, r.Partition, next, expected, topicIDArg(topicID))
	if err != nil {
		return false, err
	}
	if advanced != 1 {
		return false, c.fenced(ctx, a.Tx(), r.Topic, r.Partition, expected, next, topicID)
	}
	return claimed, nil
}

// foldStmt returns the fold prepared on the Consumer's db, or nil when the
// claim cannot be folded or the fold cannot be prepared (a table is
// missing, say): the transaction then runs the advance and the claim apart,
// whose errors say which table. It is called before the transaction begins,
// so that preparing does not need a second connection while the
// transaction holds one.
func (c *Consumer) foldStmt(ctx context.Context) *sql.Stmt {
	if c.fold == nil {
		return nil
	}
	c.prepMu.Lock()
	defer c.prepMu.Unlock()
	if c.folded != nil {
		return c.folded
	}
	stmt, err := c.db.PrepareContext(ctx, c.fold.SQL())
	if err != nil {
		return nil
	}
	c.folded = stmt
	return stmt
}

// foldError names the offsets table in the error of a folded transaction
// that failed because a table is missing: the fold's error says the claim
// table, as it cannot tell which of its two tables is missing. It looks
// after the transaction has ended, on the Consumer's db.
func (c *Consumer) foldError(ctx context.Context, err error) error {
	if !errors.Is(err, idempotent.ErrNoClaimTable) {
		return err
	}
	var pe interface {
		error
		SQLState() string
	}
	if !errors.As(err, &pe) {
		return err
	}
	var oid sql.NullString
	if qerr := c.db.QueryRowContext(ctx, `SELECT to_regclass($1)::text`, c.q.Quoted).Scan(&oid); qerr != nil || oid.Valid {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrNoOffsetsTable, c.q.Table, pe)
}
