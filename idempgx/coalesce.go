package idempgx

import (
	"context"
	"crypto/rand"
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
// loop and the final words); this file is a group's transaction on pgx,
// and pipeline.go its round trips. The members run in key order; each
// one's claim is sent just before its handler runs (its first member's
// with BEGIN), each new message's handler then gets a claimTx of its own
// on the group's connection, and one COMMIT ends the group. Before each
// claim and before COMMIT the group checks that the transaction is still
// its own: a handler that ended it (a COMMIT or ROLLBACK statement, through
// its pgx.Tx or its Conn) fails alone with idempotent.ErrAutocommit, the
// members after it were never claimed in it, and the group runs again
// without it (a member whose claim that handler's COMMIT committed then
// comes back Duplicate).
//
// Optimistic (the default): the transaction is marked with a fresh token
// (dialect.TxFencer), and each claim, and the check before COMMIT, fail
// outside the transaction so marked. A handler that fails on its own rolls
// the whole transaction back, and the group runs again without it.
//
// With savepoints: each member's claim and handler run under a savepoint,
// whose RELEASE, sent with the next member's claim (or COMMIT), is the
// check. A handler that fails on its own is rolled back to its savepoint
// (its claim with it) in one round trip; no other handler runs again.
//
// Coalescing.LockWait's bound is set in the first round trip (by the
// fence, or with savepoints by its SET LOCAL before the first savepoint)
// and bounds the claims' lock waits and the handlers'; a handler or a
// claim that waits longer for a lock leaves the group and runs alone.

// coalescer runs a Middleware's coalesced groups.
type coalescer struct {
	m          *Middleware
	savepoints bool
	// eager: the handlers only queue (WithQueuedOnly) and the design is
	// optimistic: a group claims every member with BEGIN (claimAll).
	eager bool
	// lockWait is Coalescing.LockWait's bound on Postgres; 0 is none.
	lockWait time.Duration
	// boundSQL, sent after BEGIN when not "", bounds the group's lock
	// waits: with savepoints Coalescing.LockWait's SET LOCAL, or
	// WithLockTimeout's when a group has no bound of its own.
	boundSQL string
	// The optimistic design's fence (dialect.TxFencer): fenceSQL marks the
	// transaction with its token (and sets the lock wait bound), checkSQL
	// checks the mark before COMMIT; claimSQL and claimAtSQL are the claims
	// of a message without and with an event time, checked against it.
	fenceSQL, checkSQL, claimSQL, claimAtSQL string
	// strictSQL and strictAtSQL are claimSQL and claimAtSQL made to fail
	// (SQLSTATE 22012) when they insert nothing, for oneTrip; set when
	// eager.
	strictSQL, strictAtSQL string
	// token makes each transaction's fence token (rand.Text; unit tests
	// replace it).
	token func() string
	g     coalesce.Coalescer[pgx.Tx, idempotent.Outcome]
	d     coalesce.Driver[pgx.Tx, idempotent.Outcome]
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
	co := &coalescer{m: m, savepoints: c.Savepoints, eager: m.queuedOnly && !c.Savepoints, token: rand.Text}
	co.lockWait, _ = c.LockWaitOn(m.pg) // refused before, by the core's New
	switch {
	case c.Savepoints && co.lockWait > 0:
		co.boundSQL = m.pg.LockTimeoutSQL(co.lockWait)
	case co.lockWait == 0:
		co.boundSQL = m.lockSQL
	}
	if !c.Savepoints {
		co.fenceSQL, co.checkSQL = m.pg.TxFenceSQL(co.lockWait), m.pg.TxFenceCheckSQL()
		co.claimSQL, co.claimAtSQL = m.pg.TxFencedClaimSQL(t, m.partitioned, false), m.pg.TxFencedClaimSQL(t, m.partitioned, true)
	}
	if co.eager {
		co.strictSQL, co.strictAtSQL = strictClaim(co.claimSQL), strictClaim(co.claimAtSQL)
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
		Start: groupStart(m.observer, m.consumer),
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

// once runs one transaction of the group: each member's claim, just
// before its handler, then COMMIT.
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
	g := newGroupTx(c, a)
	done := false
	defer func() {
		if !done {
			a.rollback(ctx)
		}
	}()
	var pre [][]queued // the statements each member queued in oneTrip's handlers
	if c.eager {
		var ok bool
		ok, pre, class, err = c.oneTrip(ctx, a, live, p)
		if ok {
			done = true
			return class, err
		}
		// Its handlers only queue: every claim goes with BEGIN.
		g.claimAll(ctx, live)
	}
	applied := 0
	held := false // the claim of the member before, of the same key, is this transaction's
	for i, mb := range live {
		if i > 0 && live[i-1].Key == mb.Key && held {
			continue // a duplicate, with no round trip
		}
		held = false
		eager := g.eager != nil && g.eager[i].sent
		if err := mb.Ctx.Err(); err != nil {
			// Its caller left before its turn: it was never claimed, or,
			// claimed with BEGIN, the group runs again without it.
			p.Outcomes[i] = 0
			p.Fail(mb, final{Err: m.keyError(mb.Key, err)})
			if eager {
				return dialect.Class{}, errRegroup
			}
			continue
		}
		var st claimStep
		if eager {
			st = g.eager[i].claimStep
			if st.err != nil {
				// Sent with BEGIN, before any handler ran: no handler
				// to blame.
				g.unchecked = nil
			}
		} else {
			st = g.claim(ctx, mb)
		}
		if st.queued != nil {
			// The statements a member before queued, sent with this
			// claim, failed: that member fails alone.
			again, class, err := c.queuedFailed(ctx, g, live, p, st.queuedBy, st.queued)
			if !again {
				return class, err
			}
			applied--
			st = g.claim(ctx, mb) // with savepoints, the group goes on
		}
		switch {
		case st.err != nil && (st.before || !c.savepoints && m.pg.TxFenceBroken(st.err)):
			return g.checkFailed(p, st.err)
		case st.err != nil:
			if class := g.classify(st.err); class.Retryable() {
				return class, st.err
			}
			// The member's own claim failed (a lock wait past the bound, a
			// missing partition): it runs alone.
			p.Outcomes[i] = 0
			p.Fail(mb, final{Alone: true})
			if c.savepoints {
				if _, err := g.undo(ctx); err == nil {
					continue
				}
			}
			return dialect.Class{}, errRegroup
		case st.refused != nil:
			p.Outcomes[i] = 0
			p.Fail(mb, final{Err: m.keyError(mb.Key, st.refused)})
			continue
		}
		held = true
		if !st.claimed {
			continue
		}
		p.Outcomes[i] = idempotent.Applied
		var o *own
		if pre != nil {
			g.last = pre[i] // its handler ran in oneTrip
		} else if o, class, err = c.handle(g, mb); err != nil {
			return class, err
		}
		if o == nil {
			g.unchecked = mb
			if len(g.last) > 0 {
				g.pending = append(g.pending, pending{idx: i, qs: g.last})
			}
			applied++
			continue
		}
		p.Outcomes[i], held = 0, false
		switch {
		case o.ended, o.stuck:
			// Nothing more can be sent in the transaction: the pool
			// discards a busy connection, and the server rolls it back.
		case c.savepoints:
			broken, err := g.undo(ctx)
			if err == nil {
				c.fail(p, mb, o)
				continue
			}
			o.ended = broken
		default:
			o.ended = g.rollback(ctx)
		}
		if o.ended && !o.panicked {
			o.err, o.alone = ended(o.err), false
		}
		c.fail(p, mb, o)
		return dialect.Class{}, errRegroup
	}
	for i, mb := range live {
		if p.Outcomes[i] == idempotent.Applied && !mb.Commit() {
			return dialect.Class{}, errRegroup // withdrew: its work is rolled back with the rest
		}
	}
	if applied == 0 {
		return dialect.Class{}, nil // no new message succeeded: roll back
	}
	for {
		class, err, queued, k := g.commit(ctx, p)
		if queued == nil {
			done = true
			return class, err
		}
		again, class, err := c.queuedFailed(ctx, g, live, p, k, queued)
		if !again {
			return class, err
		}
		if applied--; applied == 0 {
			return dialect.Class{}, nil // no new message left: roll back
		}
	}
}

// queuedFailed judges err, the failure of a statement that the member
// live[k] queued, sent after its handler returned (with the next claim,
// or with COMMIT). A failure of the transaction (a serialization failure
// or a deadlock that failed it, a lost connection) is the group's, retried;
// a lock wait past the group's bound sends the member alone; anything else
// (a constraint violation, say) is the member's own error. With savepoints
// the member is rolled back to its savepoint, with its claim, and the group
// goes on (again); otherwise the transaction rolls back and the group runs
// again without it (errRegroup).
func (c *coalescer) queuedFailed(ctx context.Context, g *groupTx, live []*member, p *pass, k int, err error) (again bool, class dialect.Class, _ error) {
	mb := live[k]
	if class := c.m.queuedClass(&g.a.l, err); class.Retryable() {
		return false, class, fmt.Errorf("key %q: %w", mb.Key, err)
	}
	o := &own{err: err}
	if class := c.m.pg.Classify(err); class.Kind == dialect.KindLockTimeout && c.lockWait > 0 {
		o = &own{alone: true}
	}
	p.Outcomes[k] = 0
	if c.savepoints {
		broken, uerr := g.undo(ctx)
		if uerr == nil {
			c.fail(p, mb, o)
			return true, dialect.Class{}, nil
		}
		if broken {
			o.err, o.alone = ended(err), false
		}
	} else {
		g.a.rollback(ctx)
	}
	c.fail(p, mb, o)
	return false, dialect.Class{}, errRegroup
}

// own is how a member's handler failed on its own.
type own struct {
	err      error // its error; nil when it panicked
	panicked bool
	alone    bool // it waited for a lock past the group's bound: it runs alone
	ended    bool // it ended the group's transaction
	// stuck: it left the connection busy with results it did not close,
	// so that nothing more can be sent in the group's transaction.
	stuck bool
}

// fail records mb's own failure o.
func (c *coalescer) fail(p *pass, mb *member, o *own) {
	switch {
	case o.panicked:
		p.Fail(mb, final{}) // its caller re-raises the panic
	case o.alone:
		p.Fail(mb, final{Alone: true})
	default:
		p.Fail(mb, final{Err: c.m.keyError(mb.Key, o.err)})
	}
}

// handle hands a claimTx on the group's connection to mb's caller, which
// runs its handler, and judges how it ended: o, when not nil, is a failure
// of mb's own (its error, its panic, a refused Commit or Rollback, a
// failed statement it swallowed, its context, a COMMIT or ROLLBACK
// statement); err a failure of the transaction, classified (the group
// retries a serialization failure or deadlock that failed it, or the loss
// of its connection), or mb's withdrawal in its turn (errRegroup).
func (c *coalescer) handle(g *groupTx, mb *member) (o *own, class dialect.Class, err error) {
	g.last = nil
	tx := &claimTx{a: g.a, queueOnly: c.m.queuedOnly}
	h, gone := mb.Hand(context.WithValue(mb.Ctx, claimKey{}, g.a), tx)
	tx.closed = true
	o, class, err = c.judge(g.a, mb, tx, h, gone, false)
	if o == nil && err == nil {
		g.last = tx.queue // sent with the next claim, or with COMMIT
	}
	return o, class, err
}

// judge is how mb's handler, which ran in tx on a's connection and ended
// as h (or not at all: gone), ended: as handle says. early reports that the
// handler ran before BEGIN (coalescer.oneTrip), when the connection is out
// of any transaction by design.
func (c *coalescer) judge(a *attempt, mb *member, tx *claimTx, h coalesce.Handled, gone, early bool) (o *own, class dialect.Class, err error) {
	m := c.m
	if gone {
		return nil, dialect.Class{}, errRegroup
	}
	st, closed := m.status(&a.l)
	over := !early && !closed && st == 'I' // the connection is out of any transaction
	stuck := !closed && a.l.busy()
	if h.Panicked {
		return &own{panicked: true, ended: over, stuck: stuck}, dialect.Class{}, nil
	}
	err = h.Err
	v := tx.violation
	switch {
	case err == nil:
		err = v
	case v != nil && !errors.Is(err, v):
		err = errors.Join(err, v) // the handler swallowed the refusal and failed otherwise
	}
	switch {
	case over:
		return &own{err: err, ended: true}, dialect.Class{}, nil
	case stuck:
		return &own{err: joinErr(err, errResultsOpen), stuck: true}, dialect.Class{}, nil
	case err != nil:
	case closed:
		return nil, dialect.Class{Kind: dialect.KindConnection}, fmt.Errorf("idempgx: key %q: the connection was lost", mb.Key)
	case st == 'E':
		err = fmt.Errorf("idempgx: the handler returned nil after a failed statement, which aborted the transaction: %w", pgx.ErrTxCommitRollback)
	default:
		return nil, dialect.Class{}, nil
	}
	if v == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && mb.Ctx.Err() == nil {
		if class := m.handlerClass(&a.l, err); class.Retryable() {
			return nil, class, fmt.Errorf("key %q: %w", mb.Key, err)
		}
		if class := m.pg.Classify(err); class.Kind == dialect.KindLockTimeout && c.lockWait > 0 {
			// It waited for a lock past the group's bound: it leaves the
			// group and runs alone, unbounded.
			if m.observer != nil {
				m.observer.Retry(mb.Ctx, idempotent.RetryEvent{Consumer: m.consumer, Key: mb.Key, Attempt: 1, Reason: class.Kind.String(), Code: class.Code, Err: err})
			}
			return &own{alone: true}, dialect.Class{}, nil
		}
	}
	return &own{err: err}, dialect.Class{}, nil
}

// groupStart is what a group calls before each of its transactions: the
// observer's StartGroup when it is an idempotent.GroupStarter, as the
// core's groups call it; nil otherwise.
func groupStart(o idempotent.Observer, consumer string) func(context.Context, []*member) (context.Context, func(error)) {
	s, ok := o.(idempotent.GroupStarter)
	if !ok {
		return nil
	}
	return func(ctx context.Context, live []*member) (context.Context, func(error)) {
		g := idempotent.Group{Consumer: consumer, Members: make([]idempotent.GroupMember, len(live))}
		for i, mb := range live {
			g.Members[i] = idempotent.GroupMember{Key: mb.Key, Ctx: mb.Ctx}
		}
		sctx, end := s.StartGroup(ctx, g)
		if sctx == nil {
			sctx = ctx
		}
		if end == nil {
			end = func(error) {}
		}
		return sctx, end
	}
}
