package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/coalesce"
)

// Coalesced transactions on pgx (WithCoalescing).
//
// The grouping is the core's own (internal/coalesce: joining, closing,
// each handler on its caller's goroutine in turn, withdrawal, the retry
// loop and the final words); this file is a group's transaction on pgx.
// BEGIN (with the isolation level and the lock timeout) and the group's
// claims — one INSERT … SELECT FROM unnest of its keys in key order, as
// ProcessMessages claims a batch — travel in one round trip. Each new
// message's handler then gets a claimTx of its own on the group's
// connection, and one COMMIT ends the group.
//
// Optimistic (the default): a handler that fails on its own rolls the
// whole transaction back, and the group runs again without it.
//
// With savepoints: before each new message's handler a SAVEPOINT (and the
// RELEASE of the previous member's) is queued and rides in the round trip
// of the handler's first statement (pipeline.go), so a savepoint costs no
// round trip. The claims were all taken before the first savepoint; a
// handler that fails on its own is rolled back to its savepoint, and its
// claim deleted, in one round trip — or kept for the next message of the
// same key in the group, which then runs instead. No other handler runs
// again.
//
// Coalescing.LockWait's SET LOCAL lock_timeout is queued like a savepoint,
// before the first one, and rides with the first handler's first
// statement; a handler whose statement waits longer for a lock leaves the
// group and runs alone.

// coalescer runs a Middleware's coalesced groups.
type coalescer struct {
	m          *Middleware
	savepoints bool
	deleteSQL  string // a claim's deletion, for a failed member with savepoints
	// lockWaitSQL bounds the lock waits of a group's handlers
	// (Coalescing.LockWait); "" is no bound.
	lockWaitSQL string
	g           coalesce.Coalescer[pgx.Tx, idempotent.Outcome]
	d           coalesce.Driver[pgx.Tx, idempotent.Outcome]
}

type (
	member = coalesce.Member[pgx.Tx, idempotent.Outcome]
	final  = coalesce.Final[idempotent.Outcome]
	pass   = coalesce.Pass[pgx.Tx, idempotent.Outcome]
)

// errRegroup ends a group's transaction when a member failed on its own or
// withdrew: the transaction rolls back and the group runs again without it.
var errRegroup = errors.New("idempgx: coalesced group rolled back to run again without a failed or withdrawn message")

func newCoalescer(m *Middleware, c idempotent.Coalescing, t dialect.Table) *coalescer {
	co := &coalescer{
		m:          m,
		savepoints: c.Savepoints,
		deleteSQL:  "DELETE FROM " + t.Quoted(func(s string) string { return pgx.Identifier{s}.Sanitize() }) + " WHERE consumer = $1 AND message_key = $2",
	}
	if m.partitioned {
		// Only the claim of the member's own event day: the key's claims
		// of other days are other messages'.
		co.deleteSQL += " AND event_day = $3::date"
	}
	if w, _ := c.LockWaitOn(m.pg); w > 0 { // refused before, by the core's New
		co.lockWaitSQL = m.pg.LockTimeoutSQL(w)
	}
	gctx := context.Background() // the group's own statements: no caller's context ends them
	var retried func(attempt int, class dialect.Class, err error, backoff time.Duration)
	if m.observer != nil {
		retried = func(attempt int, class dialect.Class, err error, backoff time.Duration) {
			m.observer.Retry(gctx, idempotent.RetryEvent{
				Consumer: m.consumer, Attempt: attempt, Reason: class.Kind.String(),
				Code: class.Code, Err: err, Backoff: backoff,
			})
		}
	}
	co.d = coalesce.Driver[pgx.Tx, idempotent.Outcome]{
		Retry: func(attempt func(ctx context.Context) (dialect.Class, error)) (int, error) {
			return m.policy.Run(gctx, attempt, retried)
		},
		Once: func(ctx context.Context, live []*member, p *pass) (dialect.Class, error) {
			return m.lostConnection(co.once(ctx, live, p))
		},
		Regroup: func(err error) bool { return errors.Is(err, errRegroup) },
		Wrap:    m.keyError,
		Exhausted: func(err error) bool {
			var exhausted *idempotent.RetriesExhaustedError
			return errors.As(err, &exhausted)
		},
	}
	co.g = coalesce.Coalescer[pgx.Tx, idempotent.Outcome]{Max: c.Max, Wait: c.Wait, Run: func(members []*member) { co.d.Run(members, m.partitioned) }}
	return co
}

// process is ProcessMessage under WithCoalescing, after the checks every
// call makes, on the caller's goroutine: it joins a group and runs fn when
// the group's driver hands it the transaction.
func (c *coalescer) process(ctx context.Context, key string, at time.Time, fn Func, scope idempotent.SeenScope) (idempotent.Outcome, int, error) {
	w, left := c.g.Process(ctx, key, at, fn)
	switch {
	case left != nil:
		return 0, 0, c.m.keyError(key, left)
	case w.Alone:
		return c.m.claimAndRun(ctx, key, at, fn, scope)
	case w.Err == nil:
		c.m.recordSeen(ctx, scope, key)
	}
	return w.Outcome, w.Attempts, w.Err
}

// claims returns the group's claim step: live's distinct keys, in order
// (live is sorted by key), and their event times.
func (c *coalescer) claims(live []*member) *claimBatch {
	cb := &claimBatch{m: c.m, uniq: make([]string, 0, len(live)), first: make([]int, 0, len(live))}
	for i, mb := range live {
		if i == 0 || live[i-1].Key != mb.Key {
			cb.uniq, cb.first = append(cb.uniq, mb.Key), append(cb.first, i)
		}
	}
	cb.times(func(i int) time.Time { return live[i].At })
	return cb
}

// once runs one transaction of the group: BEGIN and the claims in one
// round trip, each new message's handler, COMMIT.
func (c *coalescer) once(ctx context.Context, live []*member, p *pass) (class dialect.Class, err error) {
	m := c.m
	p.Outcomes = make([]idempotent.Outcome, len(live))
	for i := range p.Outcomes {
		p.Outcomes[i] = idempotent.Duplicate
	}
	a := &attempt{m: m}
	a.l, err = m.acquire(ctx)
	if err != nil {
		return m.pg.Classify(err), fmt.Errorf("idempgx: acquire: %w", err)
	}
	defer a.l.release()
	cb := c.claims(live)
	claimed, claimFailed, err := a.begin(ctx, cb)
	if err != nil || !claimed {
		p.ClaimFailed = claimFailed
		return a.unclaimed(ctx, err)
	}
	done := false
	defer func() {
		if !done {
			a.rollback(ctx)
		}
	}()
	if c.lockWaitSQL != "" {
		// The handlers' lock wait bound rides with the first statement
		// of the first of them, before any savepoint (which would undo it).
		a.pending = append(a.pending, c.lockWaitSQL)
	}
	var applied int
	if c.savepoints {
		applied, class, err = c.withSavepoints(ctx, a, live, cb, p)
	} else {
		applied, class, err = c.optimistic(ctx, a, live, cb, p)
	}
	if err != nil {
		return class, err
	}
	for i, mb := range live {
		if p.Outcomes[i] == idempotent.Applied && !mb.Commit() {
			return dialect.Class{}, errRegroup // withdrew: its work is rolled back with the rest
		}
	}
	if applied == 0 {
		return dialect.Class{}, nil // every new message failed alone: roll back
	}
	done = true
	a.pending = nil // a savepoint or a release before COMMIT is moot
	return a.commit(ctx)
}

// optimistic runs the new messages' handlers; the first that fails on its
// own ends the transaction (errRegroup).
func (c *coalescer) optimistic(ctx context.Context, a *attempt, live []*member, cb *claimBatch, p *pass) (int, dialect.Class, error) {
	applied := 0
	for j, ok := range cb.isNew {
		if !ok {
			continue
		}
		i := cb.first[j]
		p.Outcomes[i] = idempotent.Applied
		own, class, err := c.handle(a, live[i], p)
		switch {
		case err != nil:
			return 0, class, err
		case own:
			return 0, dialect.Class{}, errRegroup
		}
		applied++
	}
	return applied, dialect.Class{}, nil
}

// withSavepoints runs each new message's handler under a savepoint of its
// own; one that fails on its own is undone back to it, and the rest go on.
// A key given twice is applied by its first member that succeeds.
func (c *coalescer) withSavepoints(ctx context.Context, a *attempt, live []*member, cb *claimBatch, p *pass) (int, dialect.Class, error) {
	applied, j, held := 0, -1, false
	for i, mb := range live {
		if i == 0 || live[i-1].Key != mb.Key {
			j++
			held = cb.isNew[j] // the key's claim is this group's, and unused
		}
		if !held {
			continue // a duplicate
		}
		p.Outcomes[i] = idempotent.Applied
		a.queueSavepoint()
		own, class, err := c.handle(a, mb, p)
		if err != nil {
			return 0, class, err
		}
		if !own {
			held = false
			applied++
			continue
		}
		p.Outcomes[i] = 0
		next := i+1 < len(live) && live[i+1].Key == mb.Key
		args := []any{c.m.consumer, mb.Key}
		if c.m.partitioned {
			args = append(args, utcDay(mb.At))
		}
		if err := a.undoMember(ctx, c.deleteSQL, !next, args...); err != nil {
			return 0, dialect.Class{}, errRegroup // the savepoint is gone: the whole transaction goes
		}
	}
	return applied, dialect.Class{}, nil
}

// handle hands a claimTx on a's connection to mb's caller, which runs its
// handler, and judges how it ended. own reports a failure of mb's own (its
// error, its panic, a refused Commit or Rollback, a failed statement it
// swallowed, its context), recorded with p.Fail; err a failure of the
// transaction, classified (the group retries a serialization failure or
// deadlock that failed it, or the loss of its connection), a handler that
// ended the transaction (the group fails with idempotent.ErrAutocommit), or
// mb's withdrawal in its turn (errRegroup).
func (c *coalescer) handle(a *attempt, mb *member, p *pass) (own bool, class dialect.Class, err error) {
	m := c.m
	tx := &claimTx{a: a}
	h, gone := mb.Hand(context.WithValue(mb.Ctx, claimKey{}, a), tx)
	tx.closed = true
	if gone {
		return false, dialect.Class{}, errRegroup
	}
	if h.Panicked {
		p.Fail(mb, final{})
	}
	if a.pendErr != nil {
		// The group's savepoint failed: the transaction's failure.
		return false, m.pg.Classify(a.pendErr), a.pendErr
	}
	if h.Panicked {
		return true, dialect.Class{}, nil
	}
	err = h.Err
	v := tx.violation
	switch {
	case err == nil:
		err = v
	case v != nil && !errors.Is(err, v):
		err = errors.Join(err, v) // the handler swallowed the refusal and failed otherwise
	}
	st, closed := m.status(&a.l)
	if err == nil {
		switch {
		case closed:
			return false, dialect.Class{Kind: dialect.KindConnection}, fmt.Errorf("idempgx: key %q: the connection was lost", mb.Key)
		case st == 'I':
			return false, dialect.Class{}, fmt.Errorf("%w: key %q: the handler ended the coalesced group's transaction (a COMMIT or ROLLBACK statement)", idempotent.ErrAutocommit, mb.Key)
		case st == 'E':
			err = fmt.Errorf("idempgx: the handler returned nil after a failed statement, which aborted the transaction: %w", pgx.ErrTxCommitRollback)
		default:
			return false, dialect.Class{}, nil
		}
	}
	if v == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && mb.Ctx.Err() == nil {
		if class := m.handlerClass(&a.l, err); class.Retryable() {
			return false, class, fmt.Errorf("key %q: %w", mb.Key, err)
		}
		if class := m.pg.Classify(err); class.Kind == dialect.KindLockTimeout && c.lockWaitSQL != "" {
			// It waited for a lock past the group's bound: it leaves the
			// group and runs alone, unbounded.
			if m.observer != nil {
				m.observer.Retry(mb.Ctx, idempotent.RetryEvent{Consumer: m.consumer, Key: mb.Key, Attempt: 1, Reason: class.Kind.String(), Code: class.Code, Err: err})
			}
			p.Fail(mb, final{Alone: true})
			return true, dialect.Class{}, nil
		}
	}
	p.Fail(mb, final{Err: m.keyError(mb.Key, err)})
	return true, dialect.Class{}, nil
}
