package idempgx

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent/dialect"
)

// Statements that ride with the handler's.
//
// A coalesced group with savepoints (Coalescing.Savepoints) opens a
// savepoint before each new message's handler and releases the previous
// one. Neither needs an answer before the handler's first statement, so
// neither is sent on its own: they wait in attempt.pending, and the
// handler's next Exec, Query, QueryRow or SendBatch through its claimTx
// sends them in front of its own statement, in one pgx.Batch — one round
// trip. A handler that sends nothing leaves its savepoint queued for the
// next member (nothing happened under it), and the last member's release
// is left to COMMIT. A failure of a queued statement is the group's
// (attempt.pendErr): the handler's statement, which the server then
// skips, returns it too, and the group's attempt fails with it.

// exec is Exec on the attempt's connection, after the pending statements.
func (a *attempt) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(a.pending) == 0 {
		return a.l.c.Exec(ctx, sql, args...)
	}
	br, err := a.withPending(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return tag, err
}

// query is Query on the attempt's connection, after the pending
// statements; the rows close the batch when they are closed or read to
// the end.
func (a *attempt) query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if len(a.pending) == 0 {
		return a.l.c.Query(ctx, sql, args...)
	}
	br, err := a.withPending(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// queryRow is QueryRow on the attempt's connection, after the pending
// statements.
func (a *attempt) queryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if len(a.pending) == 0 {
		return a.l.c.QueryRow(ctx, sql, args...)
	}
	br, err := a.withPending(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// withPending sends the pending statements and sql in one batch, reads
// the pending ones' results and returns the batch for sql's.
func (a *attempt) withPending(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := a.takePending()
	b.Queue(sql, args...)
	br := a.l.c.SendBatch(ctx, b)
	if err := a.readPending(br, len(b.QueuedQueries)-1); err != nil {
		return nil, err
	}
	return br, nil
}

// sendBatch is SendBatch on the attempt's connection, the pending
// statements in front of the handler's own.
func (a *attempt) sendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if len(a.pending) == 0 {
		return a.l.c.SendBatch(ctx, b)
	}
	all := a.takePending()
	n := len(all.QueuedQueries)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	br := a.l.c.SendBatch(ctx, all)
	if err := a.readPending(br, n); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// flush sends the pending statements on their own, before something that
// cannot carry them (CopyFrom, the connection handed out raw).
func (a *attempt) flush(ctx context.Context) error {
	if len(a.pending) == 0 {
		return a.pendErr
	}
	b := a.takePending()
	br := a.l.c.SendBatch(ctx, b)
	if err := a.readPending(br, len(b.QueuedQueries)); err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return a.pendingFailed(err)
	}
	return nil
}

// takePending returns a batch of the pending statements and empties the
// queue: once sent, a queued savepoint is open.
func (a *attempt) takePending() *pgx.Batch {
	b := &pgx.Batch{}
	for _, s := range a.pending {
		b.Queue(s)
	}
	a.pending = a.pending[:0]
	if a.spQueued {
		a.spQueued, a.spOpen = false, true
	}
	return b
}

// readPending reads the results of the first n statements of br, the
// pending ones. On a failure it closes br and records the failure as the
// group's.
func (a *attempt) readPending(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return a.pendingFailed(err)
		}
	}
	return nil
}

func (a *attempt) pendingFailed(err error) error {
	err = fmt.Errorf("idempgx: coalesced group's savepoint: %w", err)
	if a.pendErr == nil {
		a.pendErr = err
	}
	a.spOpen = false
	return err
}

// queueSavepoint queues the savepoint a member's claim is kept apart by
// (after the release of the previous member's), unless the previous member
// left its own unsent: nothing happened under it, so it marks this
// member's start as well.
func (a *attempt) queueSavepoint() {
	if a.spQueued {
		return
	}
	if a.spOpen {
		a.pending = append(a.pending, dialect.MessageReleaseSQL)
		a.spOpen = false
	}
	a.pending = append(a.pending, dialect.MessageSavepointSQL)
	a.spQueued = true
}

// undoMember rolls a failed member's work back to its savepoint and
// releases it, in one round trip, and then, when drop is set, deletes the
// member's claim (taken with the group's, before the savepoint), so that
// the key is not claimed when the group commits. Without drop the claim
// stays for the next member of the same key. The statements go as one
// query of the simple protocol: in a transaction that a failed statement
// aborted, the extended protocol's preparation of a statement not yet
// prepared on the connection would fail before the rollback ran.
func (a *attempt) undoMember(ctx context.Context, deleteSQL string, drop bool, args ...any) error {
	var stmts []string
	for _, s := range a.pending {
		if a.spQueued && s == dialect.MessageSavepointSQL {
			continue // unsent: nothing to roll back
		}
		stmts = append(stmts, s)
	}
	a.pending, a.spQueued = a.pending[:0], false
	if a.spOpen {
		stmts = append(stmts, dialect.MessageRollbackSQL, dialect.MessageReleaseSQL)
		a.spOpen = false
	}
	qargs := []any{pgx.QueryExecModeSimpleProtocol}
	if drop {
		stmts = append(stmts, deleteSQL)
		qargs = append(qargs, args...)
	}
	if len(stmts) == 0 {
		return nil
	}
	_, err := a.l.c.Exec(ctx, strings.Join(stmts, "; "), qargs...)
	return err
}

// batchRows are a query's rows in a batch: closing them, or reading them
// to the end, closes the batch and frees the connection.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		r.err = r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is a QueryRow's row in a batch: Scan closes the batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}
