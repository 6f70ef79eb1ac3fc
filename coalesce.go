package idempotent

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
	"github.com/txclaim/idempotent/internal/coalesce"
)

// Coalesced transactions (WithCoalescing).
//
// Concurrent ProcessMessage calls join an open group; the group closes when
// it is full or its wait has passed since its first member arrived, and a
// driver goroutine then runs it in one transaction: its members in key
// order, each claimed just before its handler runs — handed to its caller's
// goroutine, one at a time, while the driver waits — and one COMMIT, after
// which every caller gets its outcome. A member's claim is never in the
// transaction before its handler is about to run, and before the next
// claim, and before COMMIT, the middleware proves the transaction is still
// the group's own: whatever a handler did to it (its own COMMIT or
// ROLLBACK, an error it swallowed, a deadlock InnoDB rolled it back for),
// the members after it were never claimed in it, and the next statement
// tells.
//
// Two designs. The optimistic one (the default, on a dialect.TxFencer:
// Postgres) marks the transaction with a random token (the fence) before
// the first handler, and every claim after a handler, and a check before
// COMMIT, fails unless it runs in the transaction so marked. A member whose
// handler fails on its own (its error, its panic, its guard violation, its
// context) rolls the whole transaction back, and the group runs again
// without it; nothing had committed, so the others' handlers run again from
// scratch. With savepoints (Coalescing.Savepoints, and the optimistic
// design's on a dialect without a fence: MySQL, MariaDB, SQLite) each
// member's claim and handler run under a savepoint of its own, whose
// RELEASE is the proof: a member that fails on its own is rolled back to it
// while the group goes on. Either way a handler that broke the transaction
// fails alone, with an error matching ErrAutocommit, and the other members
// run again in a new transaction of the group. A failure of the transaction
// itself is retried for the group by the retry policy.
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
	// lockWait is the bound of a group's lock waits (Coalescing.LockWait,
	// see LockWaitOn), 0 for none; lockWaitSQL sets it, "" for none.
	lockWait    time.Duration
	lockWaitSQL string
	// fence is the dialect's transaction fence in the optimistic design,
	// nil when the groups run with savepoints (Coalescing.Savepoints, or a
	// dialect without one); fenceSQL marks a transaction, checkSQL checks
	// the mark, claimSQL and hclaimSQL are the Middleware's claims fenced.
	fence                                   dialect.TxFencer
	fenceSQL, checkSQL, claimSQL, hclaimSQL string
	g                                       coalesce.Coalescer[*sql.Tx, Outcome]

	// run is the runner of the groups' transactions: the Middleware's, or a
	// delivery path's (see pathCoalescer), without the strict guard's check
	// after a failed body, which a group makes member by member.
	run runner
	// ord is the Middleware's ordering as a group runs it, nil without
	// WithOrdering: where the dialect has no OrderAdvanceSQL (MySQL), its
	// reads of the parking table lock (dialect.Orderer's ParkedLockSQL),
	// since the group's snapshot may predate the entity's lock.
	ord *orderer
	// A delivery path's coalescer (see pathCoalescer) sets companion: it
	// runs in every transaction of a group, after its handlers, with the
	// items of the members that did not fail; a group whose claims were all
	// duplicates then still commits.
	companion claimfold.Companion
}

// runner is the runner of the groups' transactions.
func (c *coalescer) runner() *runner { return &c.run }

// member is one caller of ProcessMessage waiting in a group.
type member = coalesce.Member[*sql.Tx, Outcome]

// final is a member's final word.
type final = coalesce.Final[Outcome]

// newCoalescer returns the coalescer of WithCoalescing(c) for m, whose
// groups run in transactions of r.
func newCoalescer(m *Middleware, c Coalescing, r runner) (*coalescer, error) {
	co := &coalescer{m: m, c: c, run: r}
	co.run.afterFailure = nil
	w, err := c.LockWaitOn(m.d)
	if err != nil {
		return nil, err
	}
	if w > 0 {
		co.lockWait, co.lockWaitSQL = w, m.d.LockTimeoutSQL(w)
	}
	if f, ok := m.d.(dialect.TxFencer); ok && !c.Savepoints {
		co.fence, co.fenceSQL, co.checkSQL = f, f.TxFenceSQL(co.lockWait), f.TxFenceCheckSQL()
		co.claimSQL = f.TxFencedClaimSQL(m.table, m.ret.part != nil, false)
		if m.hclaimSQL != "" {
			co.hclaimSQL = f.TxFencedClaimSQL(m.table, m.ret.part != nil, true)
		}
	}
	if o := m.ord; o != nil {
		co.ord = o
		if o.advanceSQL == "" {
			gord := *o
			gord.parkedSQL = o.d.ParkedLockSQL(m.table)
			co.ord = &gord
		}
	}
	co.g = coalesce.Coalescer[*sql.Tx, Outcome]{Max: c.Max, Wait: c.Wait, Run: co.runGroup}
	return co, nil
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
	var item any
	if msg.OrderKey != "" {
		item = msg // the group parks it, or decides its sequence
	}
	w, left := c.g.ProcessOrdered(ctx, msg.Key, msg.OrderKey, msg.EventTime, item, fn)
	switch {
	case left != nil:
		return 0, 0, c.keyError(msg.Key, left)
	case w.Alone:
		return c.m.claimAndRun(ctx, &c.m.run, msg, fn, scope)
	case w.Err == nil && w.Outcome != Parked:
		// A parked message may still be dead-lettered with its claim.
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

// runGroup runs a closed group of members to the end: every member gets its
// final word.
func (c *coalescer) runGroup(members []*member) {
	m := c.m
	r := c.runner()
	gctx := context.Background() // the group's own statements: no caller's context ends them
	var released []ParkedMessage // by the transaction that committed
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
			passed := false
			var rel []ParkedMessage
			class, err := r.once(ctx, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
				rel = nil
				err := c.pass(ctx, tx, st, live, p, &rel)
				passed = err == nil
				return err
			})
			if err == nil {
				released = rel
			}
			if err != nil && passed && !class.Retryable() {
				// Its COMMIT failed for good, and no member can be blamed
				// (a deferred constraint, say): each goes alone, and gets
				// an outcome of its own.
				p.CommitFailed = true
			}
			return class, err
		},
		Regroup: func(err error) bool { return errors.Is(err, errRegroup) },
		Wrap:    func(key string, err error) error { return c.keyError(key, m.reclassify(gctx, err)) },
		Exhausted: func(err error) bool {
			var exhausted *RetriesExhaustedError
			return errors.As(err, &exhausted)
		},
		Start: groupStart(m.observer, m.consumer),
	}
	d.Run(members, m.ret.part != nil)
	m.observeReleased(gctx, released)
}

// pass is the body of one transaction of a group: each member of live, in
// key order, claimed and its handler run on its caller's goroutine (passFenced
// or passSavepoints), the companion if any, then every member with work in
// the transaction marked committing. A member that fails on its own is
// recorded with p.Fail; the pass either goes on without it (savepoints) or
// returns errRegroup. An ordered member (see ordered) is decided under its
// entity's lock after its claim: parked, a duplicate, or next, when its
// handler runs and then the parked successors it made next are released
// into released.
func (c *coalescer) pass(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass, released *[]ParkedMessage) error {
	p.Outcomes = make([]Outcome, len(live))
	for i := range p.Outcomes {
		p.Outcomes[i] = Duplicate
	}
	var err error
	if c.fence != nil {
		err = c.passFenced(ctx, tx, st, live, p, released)
	} else {
		err = c.passSavepoints(ctx, tx, st, live, p, released)
	}
	if err != nil {
		return err
	}
	st.skipCommit = !slices.Contains(p.Outcomes, Applied) && !slices.Contains(p.Outcomes, Parked)
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

// passFenced is the optimistic design on a dialect.TxFencer. Claims before
// the first handler are the plain ones (so the transaction's first
// statement is a claim, as on the single path: under REPEATABLE READ its
// snapshot is taken with the claim table's lock); the fence marks the
// transaction with a fresh token just before the first handler, with the
// group's lock wait bound; each claim after a handler, and a check after
// the last one, is fenced by the token, so a handler that broke the
// transaction fails there, alone (broke). The first member that fails on
// its own ends the pass (errRegroup).
func (c *coalescer) passFenced(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass, released *[]ParkedMessage) error {
	m := c.m
	f := &txFence{claimSQL: c.claimSQL, hclaimSQL: c.hclaimSQL}
	var fenced *txFence // f once the transaction is marked
	last := -1          // the member whose handler ran last, not yet proved by a fenced statement
	for i, mb := range live {
		if i > 0 && live[i-1].Key == mb.Key {
			continue // claimed in this transaction by the key's first member: a duplicate
		}
		claimed, err := c.claim(ctx, tx, st, mb, fenced)
		if err != nil {
			if last >= 0 && c.broken(err) {
				return c.broke(live[last], p, err)
			}
			if last >= 0 && errors.Is(err, ErrBeyondRetention) {
				// The horizon refused mb: the fenced claim inserted
				// nothing, and may have skipped the fence (dialect.TxFencer).
				// Its statements succeeded, so the check can tell whether
				// the handler before broke the transaction. (A failed
				// claim statement evaluated the fence first: it would have
				// failed on it.)
				if err := c.check(ctx, tx, live[last], f, p); err != nil {
					return err
				}
			}
			return c.claimFailed(mb, p, err)
		}
		last = -1
		if !claimed {
			continue
		}
		p.Outcomes[i] = Applied
		if fenced == nil {
			f.token = newFenceToken()
			if _, err := tx.ExecContext(ctx, c.fenceSQL, f.token); err != nil {
				p.ClaimFailed = true
				return fmt.Errorf("idempotent: coalesced group: fence: %w", err)
			}
			fenced = f
		} else if m.lockSQL != "" {
			// The claim's own lock timeout (WithLockTimeout) lasts to
			// the end of the transaction: the group's bound again.
			if err := c.boundLockWaits(ctx, tx); err != nil {
				return err
			}
		}
		msg, ordered := orderedMember(mb)
		var parkedMax int64
		if ordered {
			p.Outcomes[i], parkedMax, err = c.m.orderBefore(ctx, tx, st, c.ord, msg, nil)
			if err != nil {
				return c.orderFailed(mb, p, err)
			}
			if p.Outcomes[i] != Applied {
				continue // parked, or a duplicate: no handler
			}
		}
		own, err := c.handle(ctx, tx, st, mb)
		if err != nil {
			return err
		}
		if own != nil {
			if rbErr := endTx(st, tx, false); errors.Is(rbErr, sql.ErrTxDone) && own.Err != nil && !errors.Is(own.Err, ErrAutocommit) {
				// It ended the transaction itself before it failed.
				own.Err = errors.Join(own.Err, c.keyError(mb.Key, groupBroken(rbErr)))
			}
			p.Fail(mb, *own)
			return errRegroup
		}
		if ordered && parkedMax > msg.OrderSeq {
			// Successors may be parked: prove the handler left the
			// transaction the group's before releasing them in it.
			if err := c.check(ctx, tx, mb, f, p); err != nil {
				return err
			}
			rel, err := c.m.release(ctx, tx, st, c.ord, msg.OrderKey, msg.OrderSeq, parkedMax, true)
			if err != nil {
				return c.orderFailed(mb, p, err)
			}
			*released = append(*released, rel...)
		}
		last = i
	}
	if last >= 0 {
		return c.check(ctx, tx, live[last], f, p)
	}
	return nil
}

// newFenceToken returns a random token for a group's transaction fence.
func newFenceToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// txFence is a coalesced group's fence (dialect.TxFencer) in one
// transaction: the fenced claims and the token the transaction is marked
// with.
type txFence struct {
	claimSQL, hclaimSQL string
	token               string
}

// check runs the fence's check after k's handler, the last that ran: a
// failure that says the transaction is no longer the one marked is k's
// (broke).
func (c *coalescer) check(ctx context.Context, tx *sql.Tx, k *member, f *txFence, p *pass) error {
	if _, err := tx.ExecContext(ctx, c.checkSQL, f.token); err != nil {
		if c.broken(err) {
			return c.broke(k, p, err)
		}
		return fmt.Errorf("idempotent: coalesced group: fence check: %w", err)
	}
	return nil
}

// broken reports whether err, a fenced statement's failure, says the
// transaction is no longer the group's: ended (database/sql's
// sql.ErrTxDone after a handler's tx.Commit) or not the one the fence
// marked, or aborted.
func (c *coalescer) broken(err error) bool {
	return errors.Is(err, sql.ErrTxDone) || c.fence.TxFenceBroken(err)
}

// broke fails k, whose handler broke the group's transaction as the next
// statement found (cause), alone; the others run again.
func (c *coalescer) broke(k *member, p *pass, cause error) error {
	p.Fail(k, final{Err: c.keyError(k.Key, groupBroken(cause))})
	return errRegroup
}

// groupBroken is the error of a member whose handler broke its group's
// transaction, as cause, the failure of the middleware's next statement,
// shows.
func groupBroken(cause error) error {
	return fmt.Errorf("%w: the handler broke the coalesced group's transaction, as the middleware's next statement found (%w): "+
		"it committed or rolled it back itself (tx.Commit, tx.Rollback, a COMMIT or ROLLBACK statement, one the database commits implicitly), "+
		"or went on after an error that aborted it or made the database roll it back. CLAIM MAY HAVE COMMITTED WITHOUT ITS FULL EFFECT: "+
		"if the transaction committed, this message's claim committed with the part of its effect run before, statements the handler ran after that "+
		"committed one by one, and redeliveries will be Duplicate: check its effect by hand. The group's other messages ran again without it", ErrAutocommit, cause)
}

// groupAborted is the error of a member whose handler went on after a
// statement of its own aborted the transaction, as cause, the failure of
// the release of its savepoint, shows; its work was rolled back to the
// savepoint.
func groupAborted(cause error) error {
	return fmt.Errorf("%w: the handler returned nil after a statement failed and aborted the transaction (it swallowed the error), as the release of its savepoint found (%w): "+
		"its work is rolled back, and nothing of it committed", ErrAutocommit, cause)
}

// claim claims mb on tx, fenced by f when not nil (a handler ran before it
// in tx). The strict guard's first reading is taken with the first new
// claim only.
func (c *coalescer) claim(ctx context.Context, tx *sql.Tx, st *attemptState, mb *member, f *txFence) (bool, error) {
	cst := st
	if st.txid != "" {
		cst = nil
	}
	return c.m.claimKeyFenced(ctx, tx, cst, mb.Key, mb.At, f)
}

// claimFailed handles the failure of mb's claim: a failure of the
// transaction itself (a serialization failure, a deadlock, a lost
// connection) is the group's, retried; any other concerns mb only (a busy
// key, a missing partition, the retention horizon), which goes alone — the
// transaction is rolled back and the group runs again without it.
func (c *coalescer) claimFailed(mb *member, p *pass, err error) error {
	if c.m.d.Classify(err).Retryable() {
		return err
	}
	p.Fail(mb, final{Alone: true})
	return errRegroup
}

// passSavepoints claims and handles each member of live under a savepoint
// of its own; a member that fails on its own, or whose claim fails for
// good, is rolled back to it and the group goes on. The RELEASE after a
// handler proves the transaction still the group's: when it fails, the
// member is rolled back to its savepoint if the transaction is still there
// (a handler that swallowed an error that aborted it), or else fails alone
// while the others run again (broke).
//
// On a dialect.StatementJoiner the RELEASE of a member that has a member
// after it rides with that member's SAVEPOINT, and the group's lock wait
// bound with the first SAVEPOINT: one round trip each where two were. The
// joined statement stops at its first failure, so a failure is the
// RELEASE's, judged as a RELEASE of its own would be; the next member's
// SAVEPOINT is then sent alone.
func (c *coalescer) passSavepoints(ctx context.Context, tx *sql.Tx, st *attemptState, live []*member, p *pass, released *[]ParkedMessage) error {
	m := c.m
	joiner, _ := m.d.(dialect.StatementJoiner)
	savepoint := dialect.MessageSavepointSQL
	switch {
	case c.lockWaitSQL != "" && joiner != nil:
		savepoint = joiner.JoinSQL(c.lockWaitSQL, dialect.MessageSavepointSQL)
	default:
		if err := c.boundLockWaits(ctx, tx); err != nil {
			return err
		}
	}
	unreleased := -1                  // the member whose RELEASE rides with the next SAVEPOINT
	var unreleasedRel []ParkedMessage // what that member released
	for i, mb := range live {
		if unreleased >= 0 {
			k := unreleased
			unreleased = -1
			if _, err := tx.ExecContext(ctx, joiner.JoinSQL(dialect.MessageReleaseSQL, dialect.MessageSavepointSQL)); err != nil {
				// Rolled back to its savepoint, or the pass goes: what it
				// released is undone either way.
				if err := c.releaseFailed(ctx, tx, live[k], k, p, err); err != nil {
					return err
				}
			} else {
				*released = append(*released, unreleasedRel...)
				savepoint = ""
			}
			unreleasedRel = nil
		}
		if savepoint != "" {
			if _, err := tx.ExecContext(ctx, savepoint); err != nil {
				if savepoint != dialect.MessageSavepointSQL {
					return fmt.Errorf("idempotent: coalesced group: bound lock waits, savepoint: %w", err)
				}
				return fmt.Errorf("idempotent: savepoint: %w", err)
			}
		}
		savepoint = dialect.MessageSavepointSQL
		// A key given twice is claimed twice: the second claim is new only
		// if the first member's was rolled back to its savepoint.
		claimed, err := c.claim(ctx, tx, st, mb, nil)
		if err != nil {
			if m.d.Classify(err).Retryable() {
				return err
			}
			p.Outcomes[i] = 0
			if rerr := c.rollbackTo(ctx, tx); rerr != nil {
				p.Fail(mb, final{Alone: true})
				return errRegroup // the savepoint is gone: the whole pass goes
			}
			p.Fail(mb, final{Alone: true})
			continue
		}
		msg, ordered := orderedMember(mb)
		var parkedMax int64
		var rel []ParkedMessage // released by mb, once its savepoint is
		if claimed {
			p.Outcomes[i] = Applied
			if m.lockSQL != "" {
				// The claim's own lock timeout (WithLockTimeout) lasts
				// to the end of the transaction: the group's bound again.
				if err := c.boundLockWaits(ctx, tx); err != nil {
					return err
				}
			}
			if ordered {
				p.Outcomes[i], parkedMax, err = m.orderBefore(ctx, tx, st, c.ord, msg, nil)
				if err != nil {
					if err := c.orderFailedSavepoint(ctx, tx, mb, p, err); err != nil {
						return err
					}
					p.Outcomes[i] = 0
					continue
				}
			}
		}
		if claimed && p.Outcomes[i] == Applied {
			own, err := c.handle(ctx, tx, st, mb)
			if err != nil {
				return err
			}
			if own != nil {
				p.Outcomes[i] = 0
				if rerr := c.rollbackTo(ctx, tx); rerr != nil {
					if own.Err != nil && !errors.Is(own.Err, ErrAutocommit) && !m.run.lost(rerr) {
						// It ended the transaction itself before it failed.
						own.Err = errors.Join(own.Err, c.keyError(mb.Key, groupBroken(rerr)))
					}
					p.Fail(mb, *own)
					return errRegroup // the savepoint is gone: the whole pass goes
				}
				p.Fail(mb, *own)
				continue
			}
			if ordered && parkedMax > msg.OrderSeq {
				if rel, err = m.release(ctx, tx, st, c.ord, msg.OrderKey, msg.OrderSeq, parkedMax, true); err != nil {
					if err := c.orderFailedSavepoint(ctx, tx, mb, p, err); err != nil {
						return err
					}
					p.Outcomes[i] = 0
					continue
				}
			}
		}
		if joiner != nil && i < len(live)-1 {
			unreleased, unreleasedRel = i, rel
			continue
		}
		if _, err := tx.ExecContext(ctx, dialect.MessageReleaseSQL); err != nil {
			if err := c.releaseFailed(ctx, tx, mb, i, p, err); err != nil {
				return err
			}
			continue // rolled back to its savepoint: nothing it released stands
		}
		*released = append(*released, rel...)
	}
	return nil
}

// orderedMember returns the message of a member with an ordering key.
func orderedMember(mb *member) (Message, bool) {
	msg, ok := mb.Item.(Message)
	return msg, ok && msg.OrderKey != ""
}

// orderFailed handles the failure of mb's ordered step (its sequence row,
// the parking table, a parked successor's Release) in the optimistic
// design: a failure of the transaction itself is the group's, retried;
// any other is mb's own (ErrSkippedSequence, a Release's error), and the
// group runs again without it.
func (c *coalescer) orderFailed(mb *member, p *pass, err error) error {
	if c.m.d.Classify(err).Retryable() {
		return err
	}
	p.Fail(mb, final{Err: c.keyError(mb.Key, err)})
	return errRegroup
}

// orderFailedSavepoint is orderFailed with savepoints: mb is rolled back
// to its savepoint and fails alone while the group goes on (nil), or the
// whole pass goes.
func (c *coalescer) orderFailedSavepoint(ctx context.Context, tx *sql.Tx, mb *member, p *pass, err error) error {
	if c.m.d.Classify(err).Retryable() {
		return err
	}
	p.Fail(mb, final{Err: c.keyError(mb.Key, err)})
	if rerr := c.rollbackTo(ctx, tx); rerr != nil {
		return errRegroup // the savepoint is gone: the whole pass goes
	}
	return nil
}

// releaseFailed judges the failure of the RELEASE of the savepoint of mb,
// live[i], after its claim and handler: nil when mb's handler swallowed an
// error that aborted the transaction, and mb, rolled back to its
// savepoint, fails alone while the group goes on; otherwise the pass's end
// (the transaction's own failure, or errRegroup when mb's handler broke
// the transaction).
func (c *coalescer) releaseFailed(ctx context.Context, tx *sql.Tx, mb *member, i int, p *pass, err error) error {
	if c.m.run.lost(err) || p.Outcomes[i] != Applied {
		return fmt.Errorf("idempotent: release savepoint: %w", err)
	}
	// mb's handler broke the transaction.
	p.Outcomes[i] = 0
	if rerr := c.rollbackTo(ctx, tx); rerr == nil {
		p.Fail(mb, final{Err: c.keyError(mb.Key, groupAborted(err))})
		return nil
	}
	return c.broke(mb, p, err)
}

// rollbackTo rolls tx back to the member's savepoint.
func (c *coalescer) rollbackTo(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, dialect.MessageRollbackSQL)
	return err
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
// ended. own is mb's final word when it failed on its own (its error,
// panic, guard violation, context, a wait past the group's lock wait bound,
// or the strict guard finding that it left the transaction); err a failure
// of the transaction (the group retries), or mb's withdrawal in its turn
// (errRegroup; its caller's context ended while its handler ran included,
// see coalesce.Member.HandOrLeave).
func (c *coalescer) handle(ctx context.Context, tx *sql.Tx, st *attemptState, mb *member) (own *final, err error) {
	m := c.m
	// The member's own guard token, bound to the group's connection: a
	// violation is that handler's alone. While it runs, a violation found
	// on the transaction itself (its tx.Commit) is charged to it.
	tok := &txToken{implicit: st.token.implicit, rollbacks: st.token.rollbacks}
	if conn := st.token.conn.Load(); conn != nil {
		tok.conn.Store(conn)
	}
	st.token.turn.Store(tok)
	h, gone := mb.HandOrLeave(context.WithValue(mb.Ctx, tokenKey{}, tok), tx)
	st.token.turn.Store(nil)
	if gone {
		return nil, errRegroup
	}
	if h.Panicked {
		return &final{}, nil
	}
	err = h.Err
	v := tok.violation()
	switch {
	case err == nil:
		err = v
	case v != nil && !errors.Is(err, ErrAutocommit):
		err = errors.Join(err, v)
	}
	if err == nil {
		if why := tok.endedBy(); why != nil {
			// A deadlock it swallowed, on MySQL: the database rolled the
			// group's transaction back.
			err = fmt.Errorf("%w: the handler returned nil after %w", ErrAutocommit, why)
			v = err
		}
	}
	if err != nil {
		if v == nil && !contextError(err) && mb.Ctx.Err() == nil {
			class := m.d.Classify(err)
			if class.Retryable() && c.runner().suffered(ctx, tx, class, err) {
				// The transaction's own failure: the group retries.
				return nil, fmt.Errorf("key %q: %w", mb.Key, err)
			}
			if class.Kind == dialect.KindLockTimeout && c.lockWaitSQL != "" {
				// It waited for a lock past the group's bound: it leaves
				// the group and runs alone, unbounded.
				if r := c.runner(); r.onRetry != nil {
					r.onRetry(mb.Ctx, mb.Key, 1, class, err, 0)
				}
				return &final{Alone: true}, nil
			}
		}
		if v == nil && m.txidSQL != "" {
			// The strict guard on the error path: a handler that left
			// the group's transaction before it failed has committed
			// it; it says so, loudly.
			if aerr := m.checkTxIDAfterFailure(ctx, tx, st); aerr != nil {
				err = errors.Join(err, aerr)
			}
		}
		return &final{Err: c.keyError(mb.Key, err)}, nil
	}
	if m.txidSQL != "" {
		// The strict guard after each handler: a handler that left the
		// transaction fails, loudly (ErrAutocommit), and alone.
		if err := m.checkTxID(ctx, tx, st); err != nil {
			return &final{Err: c.keyError(mb.Key, groupBroken(err))}, nil
		}
	}
	return nil, nil
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
	mc := m.co
	co := &coalescer{m: m, c: mc.c, lockWait: mc.lockWait, lockWaitSQL: mc.lockWaitSQL,
		fence: mc.fence, fenceSQL: mc.fenceSQL, checkSQL: mc.checkSQL, claimSQL: mc.claimSQL, hclaimSQL: mc.hclaimSQL,
		run: p.run, companion: companion}
	co.run.afterFailure = nil
	co.g = coalesce.Coalescer[*sql.Tx, Outcome]{Max: co.c.Max, Wait: co.c.Wait, Run: co.runGroup, Ready: ready}
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
