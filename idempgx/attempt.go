package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// conn is what an attempt needs of its connection: a *pgx.Conn, or the
// scripted fake of sequence_unit_test.go in unit tests.
type conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
}

// lease is one attempt's connection.
type lease struct {
	c   conn
	raw *pgx.Conn     // nil in unit tests
	pc  *pgxpool.Conn // nil in unit tests
}

// busy reports whether the connection is still busy with a statement's
// results: a handler returned with a query's rows or a batch's results
// open, and nothing else can be sent on it.
func (l *lease) busy() bool { return l.raw != nil && l.raw.PgConn().IsBusy() }

// errResultsOpen fails a message whose handler returned with a query's
// rows or a batch's results open (lease.busy): its own mistake, not a lost
// connection, so it is not retried.
var errResultsOpen = errors.New("idempgx: the handler returned with a query's rows or a batch's results open (close them before returning): its transaction cannot go on, and nothing of it commits")

func (l *lease) release() {
	if l.pc != nil {
		// The pool closes a connection that is not idle (a rollback that
		// could not be sent) instead of reusing it.
		l.pc.Release()
	}
}

// claimer is the claim step of an attempt: it queues its statement after
// BEGIN and reads its result.
type claimer interface {
	queue(b *pgx.Batch)
	// read returns whether anything was claimed, so that the handler runs.
	read(br pgx.BatchResults) (bool, error)
}

// claimKey is the context key of the context handed to a handler.
type claimKey struct{}

// attempt is one transaction's state.
type attempt struct {
	m     *Middleware
	l     lease
	inner pgx.Tx // the batch's transaction; nil with a fake connection
	batch pgx.Batch
	tx    claimTx
	// rollbackOnly: the body found the message a duplicate after its
	// claim inserted (an ordered message at or below its entity's last
	// sequence); the attempt rolls back, with no error.
	rollbackOnly bool
}

// run runs attempts until one ends, in the core's one retry loop
// (idempotent.RetryPolicy.Run). outcome is set to Applied or Duplicate.
func (m *Middleware) run(ctx context.Context, key string, c claimer, body Func, outcome *idempotent.Outcome) (int, error) {
	var retried func(attempt int, class dialect.Class, err error, backoff time.Duration)
	if m.observer != nil {
		retried = func(attempt int, class dialect.Class, err error, backoff time.Duration) {
			m.observer.Retry(ctx, idempotent.RetryEvent{
				Consumer: m.consumer, Key: key, Attempt: attempt, Reason: class.Kind.String(),
				Code: class.Code, Err: err, Backoff: backoff,
			})
		}
	}
	return m.policy.Run(ctx, func(ctx context.Context) (dialect.Class, error) {
		return m.lostConnection(m.once(ctx, c, body, outcome))
	}, retried)
}

// once runs one attempt: BEGIN and the claim in one round trip, then the
// handler and COMMIT, or ROLLBACK. The classification returned is of the
// failure that decided the attempt.
func (m *Middleware) once(ctx context.Context, c claimer, body Func, outcome *idempotent.Outcome) (class dialect.Class, err error) {
	a := &attempt{m: m}
	a.l, err = m.acquire(ctx)
	if err != nil {
		return m.pg.Classify(err), fmt.Errorf("idempgx: acquire: %w", err)
	}
	defer a.l.release()

	var claimed bool
	if wc, ok := c.(wireClaimer); ok && a.l.raw != nil && m.prepared {
		claimed, err = wc.wire(ctx, a.l.raw)
	} else {
		claimed, _, err = a.begin(ctx, c)
	}
	if err != nil || !claimed {
		if err == nil {
			*outcome = idempotent.Duplicate
		}
		return a.unclaimed(ctx, err)
	}
	if rc, ok := c.(rechecker); ok {
		if err := rc.recheck(ctx, &a.l); err != nil {
			class := m.pg.Classify(err)
			a.rollback(ctx)
			return class, err
		}
	}
	*outcome = idempotent.Applied

	tx := &a.tx
	tx.a, tx.queueOnly = a, m.queuedOnly
	done := false
	defer func() {
		tx.closed = true
		if !done {
			// body panicked: roll back so that the connection goes back to
			// the pool clean, then let the panic go on.
			a.rollback(ctx)
		}
	}()
	err = body(context.WithValue(ctx, claimKey{}, a), tx)
	done = true
	tx.closed = true
	if err == nil {
		err = tx.violation
	}
	if a.l.busy() {
		err = joinErr(err, errResultsOpen)
	}
	if err == nil {
		if st, closed := m.status(&a.l); !closed && st == 'I' {
			err = fmt.Errorf("%w: the handler ended the claim's transaction (a COMMIT or ROLLBACK statement)", idempotent.ErrAutocommit)
		}
	}
	if err == nil && a.rollbackOnly {
		*outcome = idempotent.Duplicate
		return a.unclaimed(ctx, nil)
	}
	if err != nil {
		class = m.handlerClass(&a.l, err)
		if tx.violation != nil && !errors.Is(err, tx.violation) {
			// The handler swallowed the refusal and failed otherwise.
			err = errors.Join(err, tx.violation)
			class = dialect.Class{}
		}
		a.rollback(ctx)
		return class, err
	}
	return a.commit(ctx, tx.queue)
}

// begin sends BEGIN (with the lock timeout) and c's claim as one pgx.Batch,
// one round trip, and reads their results; claimFailed reports a failure
// of the claim's own statement.
func (a *attempt) begin(ctx context.Context, c claimer) (claimed, claimFailed bool, err error) {
	m := a.m
	a.batch.BeginTx(m.txOpts)
	if m.lockSQL != "" {
		a.batch.Queue(m.lockSQL)
	}
	c.queue(&a.batch)
	br := a.l.c.SendBatch(ctx, &a.batch)
	a.inner = br.Tx()
	claimed, claimFailed, err = readSteps(br, m.lockSQL != "", c)
	if cerr := br.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("idempgx: claim: %w", cerr)
	}
	return claimed, claimFailed, err
}

// unclaimed ends an attempt whose claim failed with err, or, when err is
// nil, claimed nothing (a duplicate, whose outcome the caller holds): it
// rolls back and returns the attempt's classified failure.
func (a *attempt) unclaimed(ctx context.Context, err error) (dialect.Class, error) {
	m := a.m
	if err != nil {
		class := m.pg.Classify(err)
		a.rollback(ctx)
		return class, m.resolveMissingDay(ctx, &a.l, err)
	}
	if _, err := a.l.c.Exec(ctx, "rollback"); err != nil {
		return m.pg.Classify(err), fmt.Errorf("idempgx: rollback: %w", err)
	}
	return dialect.Class{}, nil
}

// commit sends the statements the handler queued, if any, and COMMIT, in
// one round trip, and returns the attempt's classified failure. A queued
// statement's failure is the handler's, classified as its errors are; the
// server skips the statements after it and COMMIT, and the attempt rolls
// back.
func (a *attempt) commit(ctx context.Context, qs []queued) (dialect.Class, error) {
	var (
		tag pgconn.CommandTag
		err error
	)
	if len(qs) == 0 {
		tag, err = a.l.c.Exec(ctx, "commit")
	} else {
		var b pgx.Batch
		queueInto(&b, qs)
		b.Queue("commit")
		br := a.l.c.SendBatch(ctx, &b)
		if err := readQueued(br, qs); err != nil {
			_ = br.Close()
			class := a.m.queuedClass(&a.l, err)
			a.rollback(ctx)
			return class, err
		}
		tag, err = br.Exec()
		if cerr := br.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		return a.m.pg.Classify(err), fmt.Errorf("idempgx: commit: %w", err)
	}
	if tag.String() == "ROLLBACK" {
		// The transaction had failed: a handler swallowed an error of one
		// of its statements and returned nil.
		return dialect.Class{}, fmt.Errorf("idempgx: commit: the transaction had failed and was rolled back (the handler returned nil after a failed statement): %w", pgx.ErrTxCommitRollback)
	}
	return dialect.Class{}, nil
}

// readBegin reads BEGIN's, the lock timeout's and the claim's results.
func readBegin(br pgx.BatchResults, lock bool, c claimer) (bool, error) {
	claimed, _, err := readSteps(br, lock, c)
	return claimed, err
}

// readSteps is readBegin, reporting also whether a failure was the
// claim's (claimFailed) rather than BEGIN's or the lock timeout's.
func readSteps(br pgx.BatchResults, lock bool, c claimer) (claimed, claimFailed bool, err error) {
	if _, err := br.Exec(); err != nil {
		return false, false, fmt.Errorf("idempgx: begin: %w", err)
	}
	if lock {
		if _, err := br.Exec(); err != nil {
			return false, false, fmt.Errorf("idempgx: set lock timeout: %w", err)
		}
	}
	claimed, err = c.read(br)
	return claimed, err != nil, err
}

// joinErr is err and also, when err is not nil, e: errors.Join without
// the nil.
func joinErr(err, e error) error {
	if err == nil {
		return e
	}
	return errors.Join(err, e)
}

// handlerClass classifies a handler's error: retryable only when it is a
// serialization failure or deadlock that failed the claim's own transaction,
// or the loss of the claim's own connection.
func (m *Middleware) handlerClass(l *lease, err error) dialect.Class {
	class := m.pg.Classify(err)
	st, closed := m.status(l)
	switch {
	case class.Kind == dialect.KindSerialization && !closed && st == 'E':
		return class
	case class.Kind == dialect.KindConnection && closed:
		return class
	}
	return dialect.Class{Kind: dialect.KindOther, Code: class.Code}
}

// rollback ends the attempt's transaction, if the connection still has one.
// Even when ctx has ended: the connection goes back to the pool.
func (a *attempt) rollback(ctx context.Context) {
	if st, closed := a.m.status(&a.l); closed || st == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = a.l.c.Exec(rctx, "rollback")
}
