package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent/dialect"
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
// A member moves through the states below; the driver and the member race
// only on a compare-and-swap out of memberWaiting, so a caller whose
// context ends either withdraws before the driver commits (its work is then
// rolled back and the group runs again without it) or waits for the COMMIT
// it can no longer stop.
const (
	memberWaiting    int32 = iota // may withdraw
	memberCommitting              // the driver is committing: wait for its word
	memberWithdrawn               // the caller left; the driver drops it
	memberFinished                // the driver has sent (or is sending) its final word
)

// coalescer gathers a Middleware's concurrent ProcessMessage calls into
// groups.
type coalescer struct {
	m          *Middleware
	max        int
	wait       time.Duration
	savepoints bool
	// lockWaitSQL bounds the lock waits of a group's handlers
	// (Coalescing.LockWait); "" is no bound.
	lockWaitSQL string
	mu          sync.Mutex
	open        *group // the group accepting members, nil if none
}

// group is the members gathered for one transaction; full is closed when
// it has max members.
type group struct {
	members []*member
	full    chan struct{}
}

// member is one caller of ProcessMessage waiting in a group.
type member struct {
	ctx   context.Context
	msg   Message
	fn    TxFunc
	state atomic.Int32
	in    chan turn     // from the driver: run the handler, or the final word; capacity 1
	ret   chan handled  // to the driver: how the handler ended; capacity 1
	gone  chan struct{} // closed when the member withdrew
}

// turn is what the driver hands a member: a transaction to run its handler
// in (ctx carries the caller's values and the member's guard token), or,
// when final is set, how the delivery ended.
type turn struct {
	ctx context.Context
	tx  *sql.Tx

	final    bool
	alone    bool // run the single-message path on the caller's goroutine
	outcome  Outcome
	attempts int
	err      error
}

// handled is how a member's handler ended.
type handled struct {
	err      error
	panicked bool
	value    any
}

// coalesceLockWaitSQL returns the statement that bounds a group's lock
// waits for Coalescing.LockWait w on d: "" where there is none to set.
func coalesceLockWaitSQL(d dialect.Dialect, w time.Duration) (string, error) {
	if w < 0 {
		return "", nil
	}
	_, resets := d.(dialect.LockTimeoutResetter)
	q := ""
	if !resets {
		bound := w
		if bound == 0 {
			bound = DefaultLockWait
		}
		q = d.LockTimeoutSQL(bound)
	}
	if q == "" && w > 0 {
		return "", fmt.Errorf("idempotent: WithCoalescing: LockWait %v: the %s dialect cannot bound lock waits for one transaction", w, d.Name())
	}
	return q, nil
}

// errRegroup ends a group's transaction when a member failed on its own or
// withdrew: the transaction rolls back and the group runs again without it.
var errRegroup = errors.New("idempotent: coalesced group rolled back to run again without a failed or withdrawn message")

// process is ProcessMessage under WithCoalescing, after the checks every
// single-message call makes (see Middleware.process), on the caller's
// goroutine: it joins a group and runs the handler when the group's driver
// hands it the transaction.
func (c *coalescer) process(ctx context.Context, msg Message, fn TxFunc) (Outcome, int, error) {
	if err := refuseNested(ctx); err != nil {
		return 0, 0, err
	}
	mb := &member{ctx: ctx, msg: msg, fn: fn, in: make(chan turn, 1), ret: make(chan handled, 1), gone: make(chan struct{})}
	c.join(mb)
	var panicked *handled // the handler's panic, re-raised once the driver has rolled back
	for {
		var t turn
		select {
		case t = <-mb.in:
		case <-ctx.Done():
			if mb.state.CompareAndSwap(memberWaiting, memberWithdrawn) {
				close(mb.gone)
				if panicked != nil {
					panic(panicked.value)
				}
				return 0, 0, c.keyError(msg.Key, ctx.Err())
			}
			// The driver is committing, or has finished with this
			// member: its word comes next.
			for t = <-mb.in; !t.final; t = <-mb.in {
				mb.ret <- handled{err: ctx.Err()}
			}
		}
		if !t.final {
			h := c.runHandler(mb, t)
			if h.panicked {
				panicked = &h
			}
			mb.ret <- h
			continue
		}
		if panicked != nil {
			panic(panicked.value)
		}
		if t.alone {
			return c.m.claimAndRun(ctx, &c.m.run, msg, fn)
		}
		if t.err == nil {
			c.m.recordSeen(ctx, msg.Key)
		}
		return t.outcome, t.attempts, t.err
	}
}

// runHandler runs mb's handler in t's transaction, catching a panic, and a
// runtime.Goexit (t.FailNow in a test), which it tells the driver of itself.
func (c *coalescer) runHandler(mb *member, t turn) (h handled) {
	ok := false
	defer func() {
		if ok {
			return
		}
		if v := recover(); v != nil {
			h = handled{panicked: true, value: v}
			return
		}
		// runtime.Goexit: this goroutine ends here, the caller with it.
		mb.state.Store(memberWithdrawn)
		mb.ret <- handled{err: errors.New("idempotent: the handler called runtime.Goexit")}
		close(mb.gone)
	}()
	err := mb.fn(t.ctx, t.tx)
	ok = true
	return handled{err: err}
}

// keyError wraps a member's failure as ProcessMessage wraps its own.
func (c *coalescer) keyError(key string, err error) error {
	return fmt.Errorf("idempotent: consumer %q, key %q: %w", c.m.consumer, key, err)
}

// join adds mb to the open group, opening one (and starting its driver) if
// there is none, and closes the group when mb fills it.
func (c *coalescer) join(mb *member) {
	c.mu.Lock()
	g := c.open
	lead := g == nil
	if lead {
		g = &group{full: make(chan struct{})}
		c.open = g
	}
	g.members = append(g.members, mb)
	if len(g.members) >= c.max {
		c.open = nil
		close(g.full)
	}
	c.mu.Unlock()
	if lead {
		go c.drive(g)
	}
}

// drive waits until g is full or its wait has passed, closes it, and runs
// it; a member left alone runs the single-message path itself.
func (c *coalescer) drive(g *group) {
	t := time.NewTimer(c.wait)
	select {
	case <-g.full:
	case <-t.C:
	}
	t.Stop()
	c.mu.Lock()
	if c.open == g {
		c.open = nil
	}
	members := g.members
	c.mu.Unlock()
	if len(members) == 1 {
		c.finish(members[0], turn{final: true, alone: true})
		return
	}
	c.run(members)
}

// finish gives mb its final word unless it withdrew.
func (c *coalescer) finish(mb *member, t turn) {
	t.final = true
	if mb.state.CompareAndSwap(memberWaiting, memberFinished) || mb.state.CompareAndSwap(memberCommitting, memberFinished) {
		mb.in <- t
	}
}

// pass is what one transaction of a group tells the driver.
type pass struct {
	outcomes    []Outcome // per live member, when the pass committed
	failed      []*member // members that failed on their own
	failures    []turn    // their final words
	claimFailed bool      // the claim statement failed
}

// run runs a closed group of members to the end: every member gets its
// final word.
func (c *coalescer) run(members []*member) {
	m := c.m
	// Key order, and arrival order among equal keys: the first arrival of a
	// key is the one whose handler runs.
	slices.SortStableFunc(members, func(a, b *member) int { return strings.Compare(a.msg.Key, b.msg.Key) })
	live := members[:0:0]
	for i, mb := range members {
		// In partitioned mode a key given again with another event day
		// would be claimed in another partition: it goes alone, as it
		// would without coalescing.
		if i > 0 && m.ret.part != nil && members[i-1].msg.Key == mb.msg.Key && !eventDay(members[i-1].msg.EventTime).Equal(eventDay(mb.msg.EventTime)) {
			c.finish(mb, turn{alone: true})
			continue
		}
		live = append(live, mb)
	}
	var (
		outcomes    []Outcome
		claimFailed bool
	)
	var retried func(attempt int, class dialect.Class, err error, backoff time.Duration)
	gctx := context.Background() // the group's own statements: no caller's context ends them
	if m.run.onRetry != nil {
		retried = func(attempt int, class dialect.Class, err error, backoff time.Duration) {
			m.run.onRetry(gctx, "", attempt, class, err, backoff)
		}
	}
	attempts, err := m.run.policy.Run(gctx, func(ctx context.Context) (dialect.Class, error) {
		for {
			live = c.prune(live)
			if len(live) == 0 {
				outcomes = nil
				return dialect.Class{}, nil
			}
			var p pass
			class, err := m.run.once(ctx, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
				return c.pass(ctx, tx, st, live, &p)
			})
			for i, mb := range p.failed {
				c.finish(mb, p.failures[i])
			}
			if errors.Is(err, errRegroup) && !errors.Is(err, ErrAutocommit) {
				continue // rolled back: again, without the failed
			}
			outcomes, claimFailed = p.outcomes, p.claimFailed
			return class, err
		}
	}, retried)
	var exhausted *RetriesExhaustedError
	for i, mb := range live {
		switch {
		case err == nil:
			c.finish(mb, turn{outcome: outcomes[i], attempts: attempts})
		case claimFailed && !errors.As(err, &exhausted):
			// The group's claim failed for good (a busy key, a missing
			// partition, the retention fence): each message finds out
			// alone which of them it was.
			c.finish(mb, turn{alone: true})
		default:
			c.finish(mb, turn{attempts: attempts, err: c.keyError(mb.msg.Key, m.reclassify(gctx, err))})
		}
	}
}

// prune drops the members that withdrew or were finished, finishes those
// whose context ended, and makes the rest waiting again (after a failed
// COMMIT they were committing).
func (c *coalescer) prune(live []*member) []*member {
	out := live[:0]
	for _, mb := range live {
		mb.state.CompareAndSwap(memberCommitting, memberWaiting)
		if mb.state.Load() != memberWaiting {
			continue
		}
		if err := mb.ctx.Err(); err != nil {
			c.finish(mb, turn{err: c.keyError(mb.msg.Key, err)})
			continue
		}
		out = append(out, mb)
	}
	return out
}

// pass is the body of one transaction of a group: the claims of live, in
// key order, and each new message's handler on its caller's goroutine,
// then every member marked committing. Without savepoints the claims are
// one statement (claimBatch) and a member that fails on its own goes to
// p.failed while the pass returns errRegroup; with savepoints each member's
// claim and handler run under a savepoint of their own, and a member that
// fails on its own is rolled back to it while the pass goes on.
func (c *coalescer) pass(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass) error {
	p.outcomes = make([]Outcome, len(live))
	for i := range p.outcomes {
		p.outcomes[i] = Duplicate
	}
	var err error
	if c.savepoints {
		err = c.passSavepoints(ctx, tx, st, live, p)
	} else {
		err = c.passOptimistic(ctx, tx, st, live, p)
	}
	if err != nil || st.skipCommit {
		return err
	}
	for i, mb := range live {
		if p.outcomes[i] == 0 {
			continue // failed on its own, rolled back to its savepoint
		}
		if !mb.state.CompareAndSwap(memberWaiting, memberCommitting) {
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
		if i == 0 || live[i-1].msg.Key != mb.msg.Key {
			uniq, first = append(uniq, mb.msg.Key), append(first, i)
		}
	}
	ats := make([]time.Time, len(uniq))
	for j, i := range first {
		ats[j] = live[i].msg.EventTime
	}
	b := batchClaim{uniq: uniq, first: first, ats: ats}
	if m.ret.part != nil {
		b.days = ats
	}
	isNew := make([]bool, len(uniq))
	claimed, err := m.claimBatch(ctx, tx, st, b, isNew)
	if err != nil {
		p.claimFailed = true
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
		p.outcomes[i] = Applied
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
		claimed, err := m.claimKey(ctx, tx, st, mb.msg.Key, mb.msg.EventTime)
		if err != nil {
			p.claimFailed = true
			return err
		}
		if claimed {
			p.outcomes[i] = Applied
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
				p.outcomes[i] = 0
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
// violation or context), recorded in p.failed; err a failure of the
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
	mb.in <- turn{ctx: context.WithValue(mb.ctx, tokenKey{}, tok), tx: tx}
	var h handled
	select {
	case h = <-mb.ret:
	case <-mb.gone:
		return false, errRegroup
	}
	if h.panicked {
		p.failed, p.failures = append(p.failed, mb), append(p.failures, turn{})
		return true, nil
	}
	err = h.err
	v := tok.violation()
	switch {
	case err == nil:
		err = v
	case v != nil && !errors.Is(err, ErrAutocommit):
		err = errors.Join(err, v)
	}
	if err != nil {
		if v == nil && !contextError(err) && mb.ctx.Err() == nil {
			class := m.d.Classify(err)
			if class.Retryable() && m.run.suffered(ctx, tx, class, err) {
				// The transaction's own failure: the group retries.
				return false, fmt.Errorf("key %q: %w", mb.msg.Key, err)
			}
			if class.Kind == dialect.KindLockTimeout && c.lockWaitSQL != "" {
				// It waited for a lock past the group's bound: it leaves
				// the group and runs alone, unbounded.
				if m.run.onRetry != nil {
					m.run.onRetry(mb.ctx, mb.msg.Key, 1, class, err, 0)
				}
				p.failed, p.failures = append(p.failed, mb), append(p.failures, turn{alone: true})
				return true, nil
			}
		}
		p.failed, p.failures = append(p.failed, mb), append(p.failures, turn{err: c.keyError(mb.msg.Key, err)})
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
