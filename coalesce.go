package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
	"github.com/txclaim/idempotent/internal/coalesce"
)

// Coalesced transactions (WithCoalescing).
//
// Concurrent ProcessMessage calls join an open group; the group closes when
// it is full or its wait has passed since its first member arrived, and a
// driver goroutine then runs it: one transaction, the group's claims in one
// statement (claimBatch, in key order), then each new message's handler —
// handed to its caller's goroutine, one at a time, while the driver waits —
// and one COMMIT, after which every caller gets its outcome. The design is
// optimistic: no savepoints. When a handler fails on its own (its error, its
// panic, its guard violation, its context), the driver rolls the whole
// transaction back and runs the group again without that message; nothing
// had committed, so the others' handlers run again from scratch. A failure
// of the transaction itself is retried for the group by the retry policy.
//
// The grouping itself — joining, closing, handing the transaction to each
// caller in turn, a caller's withdrawal, the final words — is
// internal/coalesce, shared with the pgx path (package idempgx); this file
// is the group's transaction on database/sql.

// coalescer gathers a Middleware's concurrent ProcessMessage calls into
// groups.
type coalescer struct {
	m *Middleware
	// c is the Coalescing the Middleware was created with, as given.
	c Coalescing
	// lockWaitSQL bounds the lock waits of a group's handlers
	// (Coalescing.LockWait); "" is no bound.
	lockWaitSQL string
	g           coalesce.Coalescer[*sql.Tx, Outcome]

	// A delivery path's coalescer (see pathCoalescer) sets both: r is the
	// path's runner (nil: the Middleware's), and companion runs in every
	// transaction of a group, after its handlers, with the items of the
	// members that did not fail; a group whose claims were all duplicates
	// then still commits.
	r         *runner
	companion claimfold.Companion
}

// runner is the runner of the groups' transactions.
func (c *coalescer) runner() *runner {
	if c.r != nil {
		return c.r
	}
	return &c.m.run
}

// member is one caller of ProcessMessage waiting in a group.
type member = coalesce.Member[*sql.Tx, Outcome]

// final is a member's final word.
type final = coalesce.Final[Outcome]

// newCoalescer returns the coalescer of WithCoalescing(c) for m.
func newCoalescer(m *Middleware, c Coalescing) *coalescer {
	co := &coalescer{m: m, c: c}
	co.g = coalesce.Coalescer[*sql.Tx, Outcome]{Max: c.Max, Wait: c.Wait, Run: co.run}
	return co
}

// errRegroup ends a group's transaction when a member failed on its own or
// withdrew: the transaction rolls back and the group runs again without it.
var errRegroup = errors.New("idempotent: coalesced group rolled back to run again without a failed or withdrawn message")

// process is ProcessMessage under WithCoalescing, after the checks every
// single-message call makes (see Middleware.process), on the caller's
// goroutine: it joins a group and runs the handler when the group's driver
// hands it the transaction.
func (c *coalescer) process(ctx context.Context, msg Message, fn TxFunc, scope SeenScope) (Outcome, int, error) {
	if err := refuseNested(ctx); err != nil {
		return 0, 0, err
	}
	w, left := c.g.Process(ctx, msg.Key, msg.EventTime, fn)
	switch {
	case left != nil:
		return 0, 0, c.keyError(msg.Key, left)
	case w.Alone:
		return c.m.claimAndRun(ctx, &c.m.run, msg, fn, scope)
	case w.Err == nil:
		c.m.recordSeen(ctx, scope, msg.Key)
	}
	return w.Outcome, w.Attempts, w.Err
}

// keyError wraps a member's failure as ProcessMessage wraps its own.
func (c *coalescer) keyError(key string, err error) error {
	return fmt.Errorf("idempotent: consumer %q, key %q: %w", c.m.consumer, key, err)
}

// pass is what one transaction of a group tells the driver.
type pass = coalesce.Pass[*sql.Tx, Outcome]

// run runs a closed group of members to the end: every member gets its
// final word.
func (c *coalescer) run(members []*member) {
	m := c.m
	r := c.runner()
	gctx := context.Background() // the group's own statements: no caller's context ends them
	var retried func(attempt int, class dialect.Class, err error, backoff time.Duration)
	if r.onRetry != nil {
		retried = func(attempt int, class dialect.Class, err error, backoff time.Duration) {
			r.onRetry(gctx, "", attempt, class, err, backoff)
		}
	}
	d := coalesce.Driver[*sql.Tx, Outcome]{
		Retry: func(attempt func(ctx context.Context) (dialect.Class, error)) (int, error) {
			return r.policy.Run(gctx, attempt, retried)
		},
		Once: func(ctx context.Context, live []*member, p *pass) (dialect.Class, error) {
			return r.once(ctx, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
				return c.pass(ctx, tx, st, live, p)
			})
		},
		Regroup: func(err error) bool { return errors.Is(err, errRegroup) && !errors.Is(err, ErrAutocommit) },
		Wrap:    func(key string, err error) error { return c.keyError(key, m.reclassify(gctx, err)) },
		Exhausted: func(err error) bool {
			var exhausted *RetriesExhaustedError
			return errors.As(err, &exhausted)
		},
	}
	d.Run(members, m.ret.part != nil)
}

// pass is the body of one transaction of a group: the claims of live, in
// key order, and each new message's handler on its caller's goroutine,
// then every member marked committing. Without savepoints the claims are
// one statement (claimBatch) and a member that fails on its own goes to
// p.Fail while the pass returns errRegroup; with savepoints each member's
// claim and handler run under a savepoint of their own, and a member that
// fails on its own is rolled back to it while the pass goes on.
func (c *coalescer) pass(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass) error {
	p.Outcomes = make([]Outcome, len(live))
	for i := range p.Outcomes {
		p.Outcomes[i] = Duplicate
	}
	var err error
	if c.c.Savepoints {
		err = c.passSavepoints(ctx, tx, st, live, p)
	} else {
		err = c.passOptimistic(ctx, tx, st, live, p)
	}
	if err != nil {
		return err
	}
	if c.companion != nil {
		// The companion's writes commit even when no claim was new.
		st.skipCommit = false
		if err := c.runCompanion(ctx, tx, live, p); err != nil {
			return err
		}
	}
	if st.skipCommit {
		return nil
	}
	for i, mb := range live {
		if p.Outcomes[i] == 0 {
			continue // failed on its own, rolled back to its savepoint
		}
		if p.Outcomes[i] == Duplicate && c.companion == nil {
			continue // nothing of its own in the transaction: it may leave
		}
		if !mb.Commit() {
			return errRegroup // withdrew: its work is rolled back with the rest
		}
	}
	return nil
}

// passOptimistic claims live in one statement and runs the new messages'
// handlers; the first that fails on its own ends the pass (errRegroup).
func (c *coalescer) passOptimistic(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass) error {
	m := c.m
	uniq := make([]string, 0, len(live))
	first := make([]int, 0, len(live))
	for i, mb := range live {
		if i == 0 || live[i-1].Key != mb.Key {
			uniq, first = append(uniq, mb.Key), append(first, i)
		}
	}
	ats := make([]time.Time, len(uniq))
	for j, i := range first {
		ats[j] = live[i].At
	}
	b := batchClaim{uniq: uniq, first: first, ats: ats}
	if m.ret.part != nil {
		b.days = ats
	}
	isNew := make([]bool, len(uniq))
	claimed, err := m.claimBatch(ctx, tx, st, b, isNew)
	if err != nil {
		p.ClaimFailed = true
		return err
	}
	if !claimed {
		st.skipCommit = true
		return nil
	}
	if err := c.boundLockWaits(ctx, tx); err != nil {
		return err
	}
	for j, ok := range isNew {
		if !ok {
			continue
		}
		i := first[j]
		p.Outcomes[i] = Applied
		if own, err := c.handle(ctx, tx, st, live[i], p); err != nil {
			return err
		} else if own {
			return errRegroup
		}
	}
	return nil
}

// passSavepoints claims and handles each member of live under a savepoint
// of its own; a member that fails on its own is rolled back to it.
func (c *coalescer) passSavepoints(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass) error {
	m := c.m
	applied := false
	if err := c.boundLockWaits(ctx, tx); err != nil {
		return err
	}
	for i, mb := range live {
		if _, err := tx.ExecContext(ctx, dialect.MessageSavepointSQL); err != nil {
			return fmt.Errorf("idempotent: savepoint: %w", err)
		}
		// A key given twice is claimed twice: the second claim is new only
		// if the first member's was rolled back to its savepoint.
		claimed, err := m.claimKey(ctx, tx, st, mb.Key, mb.At)
		if err != nil {
			p.ClaimFailed = true
			return err
		}
		if claimed {
			p.Outcomes[i] = Applied
			if m.lockSQL != "" {
				// The claim's own lock timeout (WithLockTimeout) lasts
				// to the end of the transaction: the group's bound again.
				if err := c.boundLockWaits(ctx, tx); err != nil {
					return err
				}
			}
			own, err := c.handle(ctx, tx, st, mb, p)
			if err != nil {
				return err
			}
			if own {
				if _, err := tx.ExecContext(ctx, dialect.MessageRollbackSQL); err != nil {
					return errRegroup // the savepoint is gone: the whole pass goes
				}
				p.Outcomes[i] = 0
				continue
			}
			applied = true
		}
		if _, err := tx.ExecContext(ctx, dialect.MessageReleaseSQL); err != nil {
			return fmt.Errorf("idempotent: release savepoint: %w", err)
		}
	}
	if !applied {
		st.skipCommit = true
	}
	return nil
}

// boundLockWaits sets the group's lock wait bound (Coalescing.LockWait),
// if any, for the rest of tx.
func (c *coalescer) boundLockWaits(ctx context.Context, tx *sql.Tx) error {
	if c.lockWaitSQL == "" {
		return nil
	}
	if _, err := tx.ExecContext(ctx, c.lockWaitSQL); err != nil {
		return fmt.Errorf("idempotent: coalesced group: bound lock waits: %w", err)
	}
	return nil
}

// handle hands tx to mb's caller, which runs its handler, and judges how it
// ended. own reports a failure of mb's own (its error, panic, guard
// violation or context), recorded with p.Fail; err a failure of the
// transaction (the group retries), of the strict guard (the group fails),
// or mb's withdrawal in its turn (errRegroup).
func (c *coalescer) handle(ctx context.Context, tx *sql.Tx, st *attemptState, mb *member, p *pass) (own bool, err error) {
	m := c.m
	// The member's own guard token, bound to the group's connection: a
	// violation is that handler's alone.
	tok := &txToken{implicit: st.token.implicit}
	if conn := st.token.conn.Load(); conn != nil {
		tok.conn.Store(conn)
	}
	h, gone := mb.Hand(context.WithValue(mb.Ctx, tokenKey{}, tok), tx)
	if gone {
		return false, errRegroup
	}
	if h.Panicked {
		p.Fail(mb, final{})
		return true, nil
	}
	err = h.Err
	v := tok.violation()
	switch {
	case err == nil:
		err = v
	case v != nil && !errors.Is(err, ErrAutocommit):
		err = errors.Join(err, v)
	}
	if err != nil {
		if v == nil && !contextError(err) && mb.Ctx.Err() == nil {
			class := m.d.Classify(err)
			if class.Retryable() && c.runner().suffered(ctx, tx, class, err) {
				// The transaction's own failure: the group retries.
				return false, fmt.Errorf("key %q: %w", mb.Key, err)
			}
			if class.Kind == dialect.KindLockTimeout && c.lockWaitSQL != "" {
				// It waited for a lock past the group's bound: it leaves
				// the group and runs alone, unbounded.
				if r := c.runner(); r.onRetry != nil {
					r.onRetry(mb.Ctx, mb.Key, 1, class, err, 0)
				}
				p.Fail(mb, final{Alone: true})
				return true, nil
			}
		}
		if v == nil && m.txidSQL != "" {
			// The strict guard on the error path: a handler that left
			// the group's transaction before it failed has committed
			// every claim of the group — the group fails, loudly, this
			// member with it.
			if aerr := m.checkTxIDAfterFailure(ctx, tx, st); aerr != nil {
				return false, errors.Join(c.keyError(mb.Key, err), aerr)
			}
		}
		p.Fail(mb, final{Err: c.keyError(mb.Key, err)})
		return true, nil
	}
	if m.txidSQL != "" {
		// The strict guard after each handler: a handler that left the
		// transaction fails the group, loudly (ErrAutocommit).
		if err := m.checkTxID(ctx, tx, st); err != nil {
			return false, err
		}
	}
	return false, nil
}

// runCompanion runs the companion with the items of the members of live
// that did not fail on their own, in live's order (key order). A member the
// companion fails is recorded with p.Fail, and the pass ends with
// errRegroup: the group runs again without it.
func (c *coalescer) runCompanion(ctx context.Context, tx *sql.Tx, live []*member, p *pass) error {
	items := make([]any, 0, len(live))
	idx := make([]int, 0, len(live))
	for i, mb := range live {
		if p.Outcomes[i] != 0 {
			items, idx = append(items, mb.Item), append(idx, i)
		}
	}
	if len(items) == 0 {
		return nil
	}
	failed, err := c.companion(ctx, tx, items)
	if err != nil {
		return err
	}
	own := false
	for j, ferr := range failed {
		if ferr == nil || j >= len(idx) {
			continue
		}
		mb := live[idx[j]]
		p.Fail(mb, final{Err: c.keyError(mb.Key, ferr)})
		own = true
	}
	if own {
		return errRegroup
	}
	return nil
}

// pathCoalescer is the claimfold.Coalescer of a delivery path: the
// Middleware's coalescing (Max, Wait, Savepoints, LockWait) on a coalescer
// of its own — its groups hold only this path's deliveries — running the
// path's runner and its companion.
type pathCoalescer struct {
	p  *path
	co *coalescer
}

// Coalescer is claimfold.Path.Coalescer.
func (p *path) Coalescer(companion claimfold.Companion, ready func() int) (claimfold.Coalescer, bool) {
	m := p.m
	if m.co == nil || companion == nil {
		return nil, false
	}
	co := &coalescer{m: m, c: m.co.c, lockWaitSQL: m.co.lockWaitSQL, r: &p.run, companion: companion}
	co.g = coalesce.Coalescer[*sql.Tx, Outcome]{Max: co.c.Max, Wait: co.c.Wait, Run: co.run, Ready: ready}
	return &pathCoalescer{p: p, co: co}, true
}

// Flush is claimfold.Coalescer.Flush.
func (pc *pathCoalescer) Flush() { pc.co.g.Flush() }

// Process is claimfold.Coalescer.Process. Unlike ProcessMessage it never
// consults nor records into WithSeen, as the path's Process does not.
func (pc *pathCoalescer) Process(ctx context.Context, key string, at time.Time, item any, fn func(context.Context, *sql.Tx) error, alone func(context.Context, claimfold.Attempt) error) (bool, error) {
	m := pc.p.m
	if fn == nil || alone == nil {
		return false, errors.New("idempotent: Coalescer.Process: nil function")
	}
	outcome, err := m.observe(ctx, key, func(ctx context.Context) (Outcome, int, error) {
		if err := m.checkMessage(Message{Key: key, EventTime: at}); err != nil {
			return 0, 0, err
		}
		if err := refuseNested(ctx); err != nil {
			return 0, 0, err
		}
		w, left := pc.co.g.ProcessItem(ctx, key, at, item, fn)
		switch {
		case left != nil:
			return 0, 0, pc.co.keyError(key, left)
		case w.Alone:
			return pc.p.process(ctx, key, at, alone)
		}
		return w.Outcome, w.Attempts, w.Err
	})
	return outcome == Applied, err
}
