package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// A coalesced group's round trips on its connection.
//
// A member's claim is sent just before its handler runs, never earlier:
// whatever a handler does to the transaction, the claims of the members
// after it are not in it. Each claim is one pgx.Batch, one round trip,
// carrying what the group has to send before it:
//
//   - the group's first claim: BEGIN (with the isolation level) and, in the
//     optimistic design, the fence (dialect.TxFencer's TxFenceSQL with the
//     transaction's own fresh token, which also sets Coalescing.LockWait's
//     bound), or, with savepoints, the bound's SET LOCAL and the member's
//     SAVEPOINT; WithLockTimeout's SET LOCAL when the group has no bound;
//   - each later claim: with savepoints, the RELEASE of the previous
//     member's savepoint — which fails once the transaction it was taken in
//     has ended, even if another was begun — and the member's SAVEPOINT;
//   - the claim itself: in the optimistic design TxFencedClaimSQL, which
//     fails, inserting nothing, outside the transaction the fence marked
//     (and, for a message with an event time, the horizon's read after it);
//     with savepoints the single path's claim.
//
// COMMIT goes after the optimistic design's TxFenceCheckSQL, or the
// RELEASE of the last savepoint, in one round trip: a transaction that a
// handler ended fails there, the server skips COMMIT, and it never commits.
//
// The connection's transaction status (pgconn's TxStatus), read locally
// after each handler, catches the common mistakes at no cost: idle ('I') is
// a handler that ended the transaction, failed ('E') one that swallowed a
// failed statement. The fence and the RELEASE catch the rest: a handler
// that ended the group's transaction and began another, after which the
// status says 'T'.

// groupTx is one transaction of a coalesced group.
type groupTx struct {
	c     *coalescer
	a     *attempt
	token string // the optimistic design's fence; "" with savepoints
	begun bool   // BEGIN was sent
	// spOpen: with savepoints, the last member's savepoint is open.
	spOpen bool
	// unchecked is the member whose handler ran last while no statement
	// since has shown the transaction to be still the group's: the one to
	// blame when the next check fails.
	unchecked *member
	// pending holds the statements that members queued (Queue), sent with
	// the next claim or with COMMIT; last is what the handler that ran last
	// queued, for once to add.
	pending []pending
	last    []queued
	// eager, in a group of handlers that only queue (WithQueuedOnly,
	// optimistic), holds each member's claim sent with BEGIN (claimAll),
	// by its index in live; a member not sent there has sent false.
	eager []eagerStep
}

// eagerStep is a member's claim sent with BEGIN.
type eagerStep struct {
	claimStep
	sent bool
}

func newGroupTx(c *coalescer, a *attempt) *groupTx {
	g := &groupTx{c: c, a: a}
	if !c.savepoints {
		g.token = c.token()
	}
	return g
}

// claimStep is how a member's claim round trip ended.
type claimStep struct {
	claimed bool
	// refused is the claim's final word when it inserted nothing because
	// the retention horizon refuses the message; the transaction goes on.
	refused error
	// err is a failed statement's error; before reports that it was one
	// sent in front of the claim (BEGIN, a bound, the fence, a SAVEPOINT
	// or RELEASE), which the claim then never ran after.
	err    error
	before bool
	// queued is the failure of a statement a member before queued (the
	// member live[queuedBy]), sent in front of the claim, which the server
	// then skipped.
	queued   error
	queuedBy int
}

// claim sends mb's claim with the statements in front of it, in one round
// trip, and reads their results.
func (g *groupTx) claim(ctx context.Context, mb *member) claimStep {
	co, m := g.c, g.c.m
	var b pgx.Batch
	first := !g.begun
	ps := g.pending
	g.pending = nil
	if first {
		b.BeginTx(m.txOpts)
		if co.boundSQL != "" {
			b.Queue(co.boundSQL)
		}
		if g.token != "" {
			b.Queue(co.fenceSQL, g.token)
		}
	} else if len(ps) > 0 && g.token != "" {
		// The check, first, shows the transaction still the group's, so
		// that a queued statement's failure is its member's own.
		b.Queue(co.checkSQL, g.token)
	}
	pre := len(b.QueuedQueries)
	queuePending(&b, ps)
	if !first && g.spOpen {
		b.Queue(dialect.MessageReleaseSQL)
	}
	if co.savepoints {
		b.Queue(dialect.MessageSavepointSQL)
	}
	before := len(b.QueuedQueries)
	c := &claimOne{m: m, at: mb.At, key: mb.Key, token: g.token}
	if m.partitioned {
		c.day = utcDay(mb.At)
	}
	c.queue(&b)
	br := g.a.l.c.SendBatch(ctx, &b)
	if first {
		g.begun, g.a.inner = true, br.Tx()
	}
	for i := 0; i < before; i++ {
		if i == pre {
			if k, err := readPending(br, ps); err != nil {
				_ = br.Close()
				return claimStep{queued: err, queuedBy: k}
			}
			i += statements(ps)
			if i == before {
				break
			}
		}
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			g.spOpen = false
			what := "coalesced group"
			if first && i == 0 {
				what = "begin"
			}
			return claimStep{err: fmt.Errorf("idempgx: %s: %w", what, err), before: true}
		}
	}
	if co.savepoints {
		// A RELEASE that succeeds shows the transaction the group's.
		g.spOpen, g.unchecked = true, nil
	}
	n, h, err := c.result(br)
	if cerr := br.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("idempgx: claim: %w", cerr)
	}
	if err != nil {
		return claimStep{err: err}
	}
	claimed, err := m.horizonClaimed(mb.Key, mb.At, n, h)
	if err != nil {
		// The horizon may have spared the fence's evaluation: this claim
		// checked nothing.
		return claimStep{refused: err}
	}
	// The fenced claim ran in the group's transaction.
	g.unchecked = nil
	return claimStep{claimed: claimed}
}

// claimAll sends BEGIN, the bound, the fence and the claim of every member
// of live (the first of each key) in one round trip, for a group whose
// handlers only queue (WithQueuedOnly), and records each claim's step in
// g.eager. A failure is recorded on the member whose statement failed —
// the first member's for a statement in front of the claims (before) —
// and the members after it are not sent.
func (g *groupTx) claimAll(ctx context.Context, live []*member) {
	co, m := g.c, g.c.m
	var b pgx.Batch
	b.BeginTx(m.txOpts)
	if co.boundSQL != "" {
		b.Queue(co.boundSQL)
	}
	b.Queue(co.fenceSQL, g.token)
	pre := len(b.QueuedQueries)
	cs := make([]*claimOne, len(live))
	for i, mb := range live {
		if i > 0 && live[i-1].Key == mb.Key {
			continue // claimed by the key's first member
		}
		c := &claimOne{m: m, at: mb.At, key: mb.Key, token: g.token}
		if m.partitioned {
			c.day = utcDay(mb.At)
		}
		c.queue(&b)
		cs[i] = c
	}
	br := g.a.l.c.SendBatch(ctx, &b)
	g.begun, g.a.inner = true, br.Tx()
	g.eager = make([]eagerStep, len(live))
	defer func() { _ = br.Close() }()
	for i := range pre {
		if _, err := br.Exec(); err != nil {
			what := "coalesced group"
			if i == 0 {
				what = "begin"
			}
			g.eager[0] = eagerStep{claimStep{err: fmt.Errorf("idempgx: %s: %w", what, err), before: true}, true}
			return
		}
	}
	for i, c := range cs {
		if c == nil {
			continue
		}
		n, h, err := c.result(br)
		if err != nil {
			g.eager[i] = eagerStep{claimStep{err: err}, true}
			return
		}
		claimed, err := m.horizonClaimed(c.key, c.at, n, h)
		if err != nil {
			g.eager[i] = eagerStep{claimStep{refused: err}, true}
			continue
		}
		g.eager[i] = eagerStep{claimStep{claimed: claimed}, true}
	}
}

// A group whose handlers only queue, in one round trip (oneTrip).
//
// Under WithQueuedOnly a handler cannot read the database, so what it
// queues does not depend on its claim: the optimistic design runs the
// group's handlers first, side by side on their callers' goroutines, and
// sends BEGIN, the bound, the fence, every member's claim, every member's
// queued statements and COMMIT in one pipeline, one round trip. Each claim
// is made strict: it fails (SQLSTATE 22012) when it inserts nothing — a
// duplicate, a message beyond the retention horizon, a transaction that is
// not the group's — and Postgres then skips every statement after it,
// COMMIT included: nothing of the group applies. So does a queued
// statement that fails. Either way the transaction is rolled back and the
// same attempt goes on with the two round trips of claimAll and commit,
// with the statements the handlers queued (no handler runs again), which
// find each claim's outcome and fail a failed statement's member alone. A
// group that meets a duplicate thus pays four round trips (the failed
// pipeline, its ROLLBACK and those two), and one that does not pays one. Every member is marked
// committing (member.Commit) before the pipeline is sent, since it holds
// COMMIT: a caller whose context ends from then on waits for the outcome,
// and when the pipeline fails the marks are taken back (Uncommit).

// oneTrip is the single path's one round trip under WithQueuedOnly, for a
// message without an event time: fn runs first, then BEGIN, the lock
// bound, the strict claim, what fn queued and COMMIT go in one pipeline.
// done reports that the message was applied there. Otherwise nothing was
// committed, or the connection was lost — a duplicate, a failed statement,
// a handler that failed (its message may be a duplicate, whose handler
// does not run), no connection to be had — and fn2 is what the two round
// trips' path, under the retry policy, runs instead of fn: the statements
// fn queued, queued again, or fn itself when it failed. (After a lost
// connection whose COMMIT landed, that path finds the claim: Duplicate, as
// after a lost COMMIT there.) A panic of fn goes to the caller, with
// nothing sent.
func (m *Middleware) oneTrip(ctx context.Context, key string, fn Func) (done bool, fn2 Func) {
	a := &attempt{m: m}
	tx := &claimTx{a: a, queueOnly: true}
	herr := fn(context.WithValue(ctx, claimKey{}, a), tx)
	tx.closed = true
	if herr != nil || tx.violation != nil {
		return false, fn
	}
	qs := tx.queue
	fn2 = func(_ context.Context, t pgx.Tx) error {
		t.(*claimTx).queue = append([]queued(nil), qs...)
		return nil
	}
	var err error
	if a.l, err = m.acquire(ctx); err != nil {
		return false, fn2 // the two round trips' path acquires under the retry policy
	}
	defer a.l.release()
	var b pgx.Batch
	b.BeginTx(m.txOpts)
	if m.lockSQL != "" {
		b.Queue(m.lockSQL)
	}
	b.Queue(m.strictSQL, m.consumer, key)
	queueInto(&b, qs)
	b.Queue("commit")
	if a.sendAll(ctx, &b) == nil {
		return true, nil
	}
	a.rollback(ctx)
	return false, fn2
}

// sendAll sends b, ending with COMMIT, on a's connection in one round trip
// and reads every result: nil when the transaction committed, else the
// first failure.
func (a *attempt) sendAll(ctx context.Context, b *pgx.Batch) error {
	br := a.l.c.SendBatch(ctx, b)
	a.inner = br.Tx()
	var (
		tag pgconn.CommandTag
		err error
	)
	for range len(b.QueuedQueries) {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// strictClaim is the claim sql made to fail with SQLSTATE 22012 when it
// inserts nothing.
func strictClaim(sql string) string {
	return "WITH claimed AS (" + sql + " RETURNING 1) SELECT 1 / count(*) FROM claimed"
}

// oneTrip runs live, whose handlers only queue, in one round trip on a's
// connection, as described above. ok reports that the attempt ended there,
// with class and err (nil err: committed, p.Outcomes set; else a failure
// of a member's own handler, recorded in p, with errRegroup, or the
// connection's loss); otherwise nothing was committed, the connection is
// out of any transaction, and pre holds what each member's handler queued,
// by its index in live, or pre is nil when no handler ran.
func (c *coalescer) oneTrip(ctx context.Context, a *attempt, live []*member, p *pass) (ok bool, pre [][]queued, class dialect.Class, err error) {
	m := c.m
	for _, mb := range live {
		if mb.Ctx.Err() != nil {
			return false, nil, dialect.Class{}, nil // the two round trips' path judges a caller that left
		}
	}
	first := func(i int) bool { return i == 0 || live[i-1].Key != live[i].Key }
	txs := make([]*claimTx, len(live))
	for i, mb := range live {
		if first(i) {
			txs[i] = &claimTx{a: a, queueOnly: true}
			mb.Give(context.WithValue(mb.Ctx, claimKey{}, a), txs[i])
		}
	}
	regroup, failed := false, false
	for i, mb := range live {
		if txs[i] == nil {
			continue
		}
		h, gone := mb.Await()
		txs[i].closed = true
		o, cl, jerr := c.judge(a, mb, txs[i], h, gone, true)
		switch {
		case o != nil && o.panicked:
			// Its caller re-raises the panic: it is not handed again.
			c.fail(p, mb, o)
			regroup = true
		case o != nil:
			// Its message may be a duplicate, whose handler does not run:
			// the two round trips' path claims first, and runs it again
			// only if it is new.
			failed = true
		case jerr != nil && !errors.Is(jerr, errRegroup) && err == nil:
			class, err = cl, jerr
		case jerr != nil:
			regroup = true
		}
	}
	switch {
	case err != nil:
		return true, nil, class, err
	case regroup:
		return true, nil, dialect.Class{}, errRegroup
	case failed:
		return false, nil, dialect.Class{}, nil
	}
	var marked []*member
	for i, mb := range live {
		if txs[i] == nil {
			continue
		}
		if !mb.Commit() {
			for _, mk := range marked {
				mk.Uncommit()
			}
			return true, nil, dialect.Class{}, errRegroup // withdrew
		}
		marked = append(marked, mb)
	}
	token := c.token()
	var b pgx.Batch
	b.BeginTx(m.txOpts)
	if c.boundSQL != "" {
		b.Queue(c.boundSQL)
	}
	b.Queue(c.fenceSQL, token)
	for i, mb := range live {
		if txs[i] == nil {
			continue
		}
		cl := &claimOne{m: m, at: mb.At, key: mb.Key, token: token, strict: true}
		if m.partitioned {
			cl.day = utcDay(mb.At)
		}
		cl.queue(&b)
	}
	pre = make([][]queued, len(live))
	for i := range live {
		if txs[i] != nil {
			pre[i] = txs[i].queue
			queueInto(&b, txs[i].queue)
		}
	}
	b.Queue("commit")
	if err = a.sendAll(ctx, &b); err == nil {
		for i := range live {
			if txs[i] != nil {
				p.Outcomes[i] = idempotent.Applied
			}
		}
		return true, nil, dialect.Class{}, nil
	}
	if _, closed := m.status(&a.l); closed {
		// COMMIT may have landed: the group runs again, and finds its
		// claims.
		return true, nil, dialect.Class{Kind: dialect.KindConnection}, fmt.Errorf("idempgx: coalesced group: %w", err)
	}
	a.rollback(ctx)
	for _, mk := range marked {
		mk.Uncommit()
	}
	return false, pre, dialect.Class{}, nil
}

// queueClaim queues the optimistic design's fenced claim of c, fence its
// horizon fence, and for a message with an event time the horizon's read
// after it.
func (co *coalescer) queueClaim(b *pgx.Batch, c *claimOne, fence time.Time) {
	m := co.m
	plain, at := co.claimSQL, co.claimAtSQL
	if c.strict {
		plain, at = co.strictSQL, co.strictAtSQL
	}
	switch {
	case !c.fenced():
		b.Queue(plain, m.consumer, c.key, c.token)
		return
	case c.day != "":
		b.Queue(at, m.consumer, c.key, c.day, fence, c.token)
	default:
		b.Queue(at, m.consumer, c.key, fence, c.token)
	}
	if !c.strict {
		b.Queue(m.horizonSQL, m.horizonArgs...)
	}
}

// readClaim reads the results queueClaim queued: the claims inserted, and
// the horizon.
func (co *coalescer) readClaim(br pgx.BatchResults, c *claimOne) (int64, *int64, error) {
	tag, err := br.Exec()
	if err != nil {
		return 0, nil, co.m.claimError(err, c.at)
	}
	if !c.fenced() {
		return tag.RowsAffected(), nil, nil
	}
	var h *int64
	if err := br.QueryRow().Scan(&h); err != nil {
		return 0, nil, fmt.Errorf("idempgx: claim: read the retention horizon: %w", err)
	}
	return tag.RowsAffected(), h, nil
}

// broken reports whether err, a failed check, says that the transaction
// is no longer the group's — a RELEASE or a statement in front of a claim
// with savepoints, the fence's statement in the optimistic design — rather
// than that the connection was lost.
func (g *groupTx) broken(err error) bool {
	if _, closed := g.c.m.status(&g.a.l); closed {
		return false
	}
	return g.c.savepoints || g.c.m.pg.TxFenceBroken(err)
}

// undo rolls the transaction back to the member's savepoint and releases
// it, in one query of the simple protocol, which an aborted transaction
// accepts (the extended protocol's preparation of a statement not yet
// prepared on the connection would fail first). broken reports that the
// server refused, so that the savepoint, and with it the group's
// transaction, is gone (the handler ended it); err is any failure.
func (g *groupTx) undo(ctx context.Context) (broken bool, err error) {
	g.spOpen = false
	if _, err = g.a.l.c.Exec(ctx, dialect.MessageRollbackSQL+"; "+dialect.MessageReleaseSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		_, closed := g.c.m.status(&g.a.l)
		return !closed, err
	}
	g.unchecked = nil
	return false, nil
}

// rollback ends the optimistic design's transaction after a member failed
// on its own, with the fence's check in front of ROLLBACK in the same round
// trip; broken reports that the check failed: the member's handler had
// ended the group's transaction and begun another. A failed transaction
// ('E') cannot run the check, and an idle connection has nothing to end.
func (g *groupTx) rollback(ctx context.Context) (broken bool) {
	if st, closed := g.c.m.status(&g.a.l); !closed && st == 'T' && g.token != "" {
		var b pgx.Batch
		b.Queue(g.c.checkSQL, g.token)
		b.Queue("rollback")
		br := g.a.l.c.SendBatch(ctx, &b)
		_, err := br.Exec()
		_ = br.Close()
		broken = err != nil && g.broken(err)
	}
	g.a.rollback(ctx) // after a failed check: the transaction is still open
	return broken
}

// commit sends COMMIT after the check — the fence's, or the RELEASE of
// the last savepoint — in one round trip, with the statements the last
// member queued between the fence's check and COMMIT, or before the
// RELEASE. A failed check blames the handler that ran last (errRegroup). A
// failed queued statement is returned as queued, for its member
// (coalescer.queuedFailed); the transaction is then aborted, still open. A
// COMMIT that fails for a reason no member can be blamed for is retried for
// the group when its class is retryable, and otherwise sends every member
// alone.
func (g *groupTx) commit(ctx context.Context, p *pass) (class dialect.Class, err, queued error, queuedBy int) {
	var b pgx.Batch
	ps := g.pending
	g.pending = nil
	if g.token != "" {
		b.Queue(g.c.checkSQL, g.token)
	}
	queuePending(&b, ps)
	if g.spOpen {
		b.Queue(dialect.MessageReleaseSQL)
	}
	b.Queue("commit")
	br := g.a.l.c.SendBatch(ctx, &b)
	if g.token != "" {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			g.a.rollback(ctx)
			class, err := g.checkFailed(p, fmt.Errorf("idempgx: coalesced group: %w", err))
			return class, err, nil, -1
		}
	}
	if k, err := readPending(br, ps); err != nil {
		_ = br.Close()
		return dialect.Class{}, nil, err, k
	}
	if g.spOpen {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			g.a.rollback(ctx)
			class, err := g.checkFailed(p, fmt.Errorf("idempgx: coalesced group: %w", err))
			return class, err, nil, -1
		}
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	// A COMMIT no member can be blamed for that will not succeed again
	// (a deferred constraint, a terminated backend): every member runs
	// alone, to its own outcome. (Pass.ClaimFailed is the driver's word for
	// sending every member alone.)
	if err != nil {
		class := g.classify(err)
		p.ClaimFailed = !class.Retryable()
		return class, fmt.Errorf("idempgx: commit: %w", err), nil, -1
	}
	if tag.String() == "ROLLBACK" {
		p.ClaimFailed = true
		return dialect.Class{}, fmt.Errorf("idempgx: commit: the transaction had failed and was rolled back: %w", pgx.ErrTxCommitRollback), nil, -1
	}
	return dialect.Class{}, nil, nil, -1
}

// checkFailed judges err, a failed check: when a handler ran since the
// last check passed and the transaction is no longer the group's, that
// handler's message fails alone (ErrAutocommit) and the group runs again
// without it; otherwise it is the transaction's failure.
func (g *groupTx) checkFailed(p *pass, err error) (dialect.Class, error) {
	if mb := g.unchecked; mb != nil && g.broken(err) {
		p.Fail(mb, final{Err: g.c.m.keyError(mb.Key, ended(err))})
		return dialect.Class{}, errRegroup
	}
	return g.classify(err), err
}

// classify classifies err, the failure of a group's statement: the loss
// of the connection when it is closed (pgx's pipeline returns a failed
// read's error as it is), as the dialect says otherwise.
func (g *groupTx) classify(err error) dialect.Class {
	if _, closed := g.c.m.status(&g.a.l); closed {
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return g.c.m.pg.Classify(err)
}

// ended is the error of a message whose handler ended the group's
// transaction; cause, when not nil, is what showed it or what the handler
// returned.
func ended(cause error) error {
	const what = "the handler ended the coalesced group's transaction (a COMMIT, END or ROLLBACK statement, perhaps followed by BEGIN): " +
		"its claim may have committed with a part of its effect, and a redelivery would then be a duplicate"
	if cause == nil {
		return fmt.Errorf("%w: %s", idempotent.ErrAutocommit, what)
	}
	return fmt.Errorf("%w: %s: %w", idempotent.ErrAutocommit, what, cause)
}
