package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
)

// claimTx is the pgx.Tx a handler gets: the claim's transaction, on the
// attempt's connection. The middleware owns its end: Commit and Rollback
// refuse. Begin opens a savepoint, as pgx's own nested transactions do.
// In a coalesced group each member's handler gets a claimTx of its own on
// the group's attempt.
type claimTx struct {
	a      *attempt
	closed bool
	// savepoints counts the savepoints opened, to name them.
	savepoints int
	// violation is the first refusal of Commit or Rollback: it fails the
	// delivery even if the handler swallowed it.
	violation error
	// queue holds the statements the handler queued (Queue) and has not
	// sent yet.
	queue []queued
	// queueOnly: the Middleware was made WithQueuedOnly, and statements
	// run at once refuse.
	queueOnly bool
}

var _ pgx.Tx = (*claimTx)(nil)

// ErrQueuedOnly reports a statement a handler tried to run at once on a
// Middleware made WithQueuedOnly, whose handlers only queue (Queue).
var ErrQueuedOnly = errors.New("idempgx: the Middleware was made WithQueuedOnly: its handlers queue their statements (Queue) and run none at once")

// immediate refuses a statement run at once on a Middleware made
// WithQueuedOnly, recording the refusal so that it fails the delivery
// even if the handler swallows it.
func (t *claimTx) immediate(op string) error {
	if !t.queueOnly {
		return nil
	}
	err := fmt.Errorf("%w: %s refused", ErrQueuedOnly, op)
	if t.violation == nil {
		t.violation = err
	}
	return err
}

func (t *claimTx) refuse(op string) error {
	err := fmt.Errorf("%w: the handler called %s on the claim's transaction; the middleware commits or rolls back", idempotent.ErrAutocommit, op)
	if t.violation == nil {
		t.violation = err
	}
	return err
}

// Begin opens a savepoint: Commit on the returned Tx releases it, Rollback
// rolls back to it.
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := t.immediate("Begin"); err != nil {
		return nil, err
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	t.savepoints++
	sp := &savepointTx{parent: t, name: "idempgx_sp_" + strconv.Itoa(t.savepoints)}
	if _, err := t.a.l.c.Exec(ctx, "savepoint "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// Commit refuses: the middleware commits after the handler returns.
func (t *claimTx) Commit(context.Context) error { return t.refuse("Commit") }

// Rollback refuses: return an error from the handler to roll back.
func (t *claimTx) Rollback(context.Context) error { return t.refuse("Rollback") }

func (t *claimTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	if err := t.immediate("CopyFrom"); err != nil {
		return 0, err
	}
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.a.l.c.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if err := t.immediate("SendBatch"); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.a.l.c.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the claim's transaction.
func (t *claimTx) LargeObjects() pgx.LargeObjects {
	if t.immediate("LargeObjects") != nil || t.a.inner == nil {
		return pgx.LargeObjects{}
	}
	return t.a.inner.LargeObjects()
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := t.immediate("Prepare"); err != nil {
		return nil, err
	}
	return t.a.l.c.Prepare(ctx, name, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if err := t.immediate("Exec"); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := t.flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.a.l.c.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := t.immediate("Query"); err != nil {
		return nil, err
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.a.l.c.Query(ctx, sql, args...)
}

func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return errRow{pgx.ErrTxClosed}
	}
	if err := t.immediate("QueryRow"); err != nil {
		return errRow{err}
	}
	if err := t.flush(ctx); err != nil {
		return errRow{err}
	}
	return t.a.l.c.QueryRow(ctx, sql, args...)
}

// Conn returns the claim's connection (nil in unit tests, whose
// connection is a scripted fake), after sending the statements the handler
// queued, so that those it runs on the connection come after them. A
// queued statement that fails there aborts the transaction, which fails
// the delivery when the handler returns. On a Middleware made
// WithQueuedOnly it returns nil, and the delivery fails (ErrQueuedOnly).
func (t *claimTx) Conn() *pgx.Conn {
	if t.immediate("Conn") != nil {
		return nil
	}
	if !t.closed {
		_ = t.flush(context.Background())
	}
	return t.a.l.raw
}

// savepointTx is a savepoint inside the claim's transaction.
type savepointTx struct {
	parent *claimTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) usable() bool { return !s.closed && !s.parent.closed }

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !s.usable() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Begin(ctx)
}

// Commit releases the savepoint.
func (s *savepointTx) Commit(ctx context.Context) error {
	if !s.usable() {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.a.l.c.Exec(ctx, "release savepoint "+s.name)
	return err
}

// Rollback rolls back to the savepoint.
func (s *savepointTx) Rollback(ctx context.Context) error {
	if !s.usable() {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.a.l.c.Exec(ctx, "rollback to savepoint "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if !s.usable() {
		return 0, pgx.ErrTxClosed
	}
	return s.parent.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !s.usable() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return s.parent.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.parent.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if !s.usable() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.usable() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.parent.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !s.usable() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !s.usable() {
		return errRow{pgx.ErrTxClosed}
	}
	return s.parent.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.parent.Conn() }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
