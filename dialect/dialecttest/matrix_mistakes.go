package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent"
)

// The matrix's handler mistakes. Five messages are delivered at once (a
// group in the coalesced modes, a batch in the batch mode); the handler of
// the middle one (in key order; in a batch, the batch function after the
// batch's effects) makes the mistake on its first run, after its own
// effect. Each cell then checks in the database:
//
//   - the culprit ended as the mistake must end it, given what the
//     database did to the transaction (as the handler saw it);
//   - every other message either applied with its effect once, or failed
//     with no claim and no effect — or, where the culprit committed the
//     group's transaction itself, came back Duplicate, its effect committed
//     once with its claim;
//   - redelivering every failed message until it settles leaves each
//     effect exactly once, with one claim.

const (
	mistakeMessages = 5
	culpritIndex    = 2 // m3: two messages before it in key order, two after
)

// wantKind is how a mistake's culprit must end.
type wantKind int

const (
	// wantApplied: Applied, its claim and effect committed once.
	wantApplied wantKind = iota
	// wantFailed: an error, nothing of the delivery committed.
	wantFailed
	// wantCommitted: the handler committed its claim and effect itself;
	// an error, or, where nothing checks the transaction and no error
	// shows, Applied.
	wantCommitted
	// wantGone: the transaction is gone with the claim and the effect; an
	// error, or, where nothing checks the transaction, Applied with
	// nothing committed: the effect is lost, as documented.
	wantGone
	// wantPanic: the handler's panic reaches its caller; nothing committed.
	wantPanic
	// wantRetried: the attempt failed on a retryable error the handler
	// swallowed: an error with nothing committed, or Applied by a retry.
	wantRetried
	// wantDuplicate: Duplicate, its claim and effect committed once (by
	// the culprit's own commit of the group's transaction).
	wantDuplicate
)

func (k wantKind) String() string {
	return [...]string{"applied", "failed, nothing committed", "committed by the handler", "gone", "panic, nothing committed", "failed or applied by a retry", "duplicate"}[k]
}

// want is what a mistake's culprit must end as.
type want struct {
	kind wantKind
	// is: the culprit's error must match it.
	is error
	// mustFail: wantCommitted and wantGone must end in an error (the
	// transaction is checked).
	mustFail bool
	// escaped is the count of the write made outside the transaction.
	escaped int
	// why is logged.
	why string
}

// observed is what the culprit's handler saw of its mistake.
type observed struct {
	// err is what the mistake's statement or call returned.
	err error
	// read and readErr: the culprit's effect read back through the
	// transaction after the mistake, where the mistake reads it.
	read    int64
	readErr error
	// cancel cancels the culprit's context.
	cancel context.CancelFunc
	// adversary is closed when the transaction a deadlock mistake set
	// against the handler has ended.
	adversary chan struct{}
}

// mistake is a handler mistake: what the culprit does, and how it must end.
type mistake[T any] struct {
	name  string
	guard bool
	needs func(c *cell[T]) string
	// act runs in the culprit's handler after its effect (counter fx
	// row own), on its first run only; its result is the handler's.
	act func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error
	// want is the culprit's expected end, given what it observed.
	want func(c *cell[T], o *observed) want
}

// Counters of a mistake cell besides the messages' own (1 to 5).
const (
	escapeRow = mistakeMessages + 1 // written outside the transaction
	lockRow   = mistakeMessages + 2 // the deadlock's second row
)

func mistakeScenarios[T any]() []scenario[T] {
	var out []scenario[T]
	for _, mk := range mistakes[T]() {
		out = append(out, scenario[T]{name: "Mistake/" + mk.name, guard: mk.guard, needs: mk.needs, run: func(c *cell[T]) { c.mistake(mk) }})
	}
	return out
}

// errHandler is the error the Error mistake returns.
var errHandler = errors.New("dialecttest: the handler failed")

// panicValue is what the Panic mistake panics with.
const panicValue = "dialecttest: the handler panicked"

func mistakes[T any]() []mistake[T] {
	deadlockNeeds := func(c *cell[T]) string {
		if c.e.h.SerialWriters {
			return "SerialWriters: one writer at a time, no deadlock"
		}
		return ""
	}
	return []mistake[T]{
		{
			name: "Error",
			act: func(*cell[T], context.Context, T, *Effects, int, *observed) error {
				return errHandler
			},
			want: func(*cell[T], *observed) want { return want{kind: wantFailed, is: errHandler} },
		},
		{
			name: "Panic",
			act: func(*cell[T], context.Context, T, *Effects, int, *observed) error {
				panic(panicValue)
			},
			want: func(*cell[T], *observed) want { return want{kind: wantPanic} },
		},
		{
			// A statement fails and the handler carries on: Postgres
			// has aborted the transaction, other databases kept it.
			name:  "SwallowedError",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
				o.err = c.d.Exec(ctx, tx, "INSERT INTO "+c.table+"_nosuch (id) VALUES (1)")
				o.read, o.readErr = c.d.QueryInt(ctx, tx, fx.ReadSQL(own))
				return nil
			},
			want: func(c *cell[T], o *observed) want { return c.afterSwallowed(o) },
		},
		{
			// The handler's statement is a deadlock's victim and it
			// returns the error: the transaction is retried.
			name:  "Deadlock/Returned",
			needs: deadlockNeeds,
			act: func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
				o.err = c.deadlock(ctx, tx, fx, own, o)
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				c.provoked(o)
				return want{kind: wantApplied, why: "retried: " + o.err.Error()}
			},
		},
		{
			// The same, swallowed: Postgres has aborted the transaction,
			// InnoDB rolled it back and left it.
			name:  "Deadlock/Swallowed",
			guard: true,
			needs: deadlockNeeds,
			act: func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
				o.err = c.deadlock(ctx, tx, fx, own, o)
				o.read, o.readErr = c.d.QueryInt(ctx, tx, fx.ReadSQL(own))
				return nil
			},
			want: func(c *cell[T], o *observed) want {
				c.provoked(o)
				w := c.afterSwallowed(o)
				if w.kind == wantFailed {
					// The attempt failed on a retryable error: the
					// middleware may retry it.
					w.kind = wantRetried
				}
				return w
			},
		},
		{
			name:  "Commit",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, _ *Effects, _ int, o *observed) error {
				o.err = c.d.Commit(ctx, tx)
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				if o.err != nil {
					return want{kind: wantFailed, is: idempotent.ErrAutocommit, why: "refused: " + o.err.Error()}
				}
				c.refusable(o, "the handler's Commit", true)
				return want{kind: wantCommitted, is: idempotent.ErrAutocommit, mustFail: true}
			},
		},
		{
			name:  "Rollback",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, _ *Effects, _ int, o *observed) error {
				o.err = c.d.Rollback(ctx, tx)
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				if o.err != nil {
					return want{kind: wantFailed, is: idempotent.ErrAutocommit, why: "refused: " + o.err.Error()}
				}
				c.refusable(o, "the handler's Rollback", true)
				return want{kind: wantFailed, is: idempotent.ErrAutocommit}
			},
		},
		{
			name:  "CommitStatement",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, _ *Effects, _ int, o *observed) error {
				o.err = c.d.Exec(ctx, tx, "COMMIT")
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				if o.err != nil {
					return want{kind: wantFailed, is: idempotent.ErrAutocommit, why: "refused: " + o.err.Error()}
				}
				c.refusable(o, "a COMMIT statement", false)
				return c.afterCommitted()
			},
		},
		{
			// COMMIT as the second statement of a string, where the
			// driver sends such a string at all.
			name:  "CommitInString",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
				o.err = c.d.Exec(ctx, tx, fmt.Sprintf("UPDATE %s SET n = n WHERE id = %d; COMMIT", fx.Name(), own))
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				switch {
				case errors.Is(o.err, idempotent.ErrAutocommit):
					return want{kind: wantFailed, is: idempotent.ErrAutocommit, why: "refused: " + o.err.Error()}
				case o.err != nil:
					return want{kind: wantFailed, is: o.err, why: "the driver does not send a string of statements: " + o.err.Error()}
				}
				return c.afterCommitted()
			},
		},
		{
			name:  "RollbackStatement",
			guard: true,
			act: func(c *cell[T], ctx context.Context, tx T, _ *Effects, _ int, o *observed) error {
				o.err = c.d.Exec(ctx, tx, "ROLLBACK")
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				if o.err != nil {
					return want{kind: wantFailed, is: idempotent.ErrAutocommit, why: "refused: " + o.err.Error()}
				}
				c.refusable(o, "a ROLLBACK statement", false)
				if c.checked() {
					return want{kind: wantFailed, is: idempotent.ErrAutocommit}
				}
				return want{kind: wantGone, why: "nothing checks the transaction before COMMIT in this mode: open the database with GuardConnector, or use WithStrictGuard"}
			},
		},
		{
			// A write through the pool with the handler's context: it
			// commits on its own, outside the claim's transaction.
			name:  "PoolWrite",
			guard: true,
			act: func(c *cell[T], ctx context.Context, _ T, fx *Effects, _ int, o *observed) error {
				// Bounded: on a database with one writer the write
				// waits for the claim's own transaction.
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				o.err = c.dl.PoolExec(wctx, fx.BumpSQL(escapeRow))
				return o.err
			},
			want: func(c *cell[T], o *observed) want {
				switch {
				case c.d.Guarded:
					if !errors.Is(o.err, idempotent.ErrAutocommit) {
						c.t.Errorf("GuardConnector let a write through the pool with the handler's context reach the database: %v", o.err)
					}
					return want{kind: wantFailed, is: idempotent.ErrAutocommit}
				case o.err != nil:
					return want{kind: wantFailed, is: o.err, why: "the write failed: " + o.err.Error()}
				}
				return want{kind: wantApplied, escaped: 1, why: "the write through the pool committed on its own: not exactly once, and caught only by GuardConnector"}
			},
		},
		{
			// The caller's context ends while its handler runs.
			name: "Cancelled",
			act: func(c *cell[T], ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
				o.cancel()
				o.err = c.d.Exec(ctx, tx, fx.BumpSQL(own))
				return o.err
			},
			want: func(*cell[T], *observed) want { return want{kind: wantFailed, is: context.Canceled} },
		},
	}
}

// checked reports whether the Middleware checks, before COMMIT, that the
// transaction is still its own: in the coalesced modes (a fence or a
// savepoint), under the strict guard, or always (Driver.Checked).
func (c *cell[T]) checked() bool {
	return c.m.Coalesced || c.m.StrictGuard || c.d.Checked
}

// refusable fails the cell when the guard, or a transaction that refuses
// its own end (end: the mistake is a Commit or Rollback call), let through
// what it refuses: the mistake reached the database.
func (c *cell[T]) refusable(o *observed, what string, end bool) {
	c.t.Helper()
	switch {
	case c.d.Guarded:
		c.t.Errorf("GuardConnector let %s reach the database", what)
	case end && c.d.RefusesEnd:
		c.t.Errorf("the %s driver's transaction let %s through", c.d.Name, what)
	}
}

// afterCommitted is how a culprit that committed the transaction with a
// statement must end: the claim and the effect so far committed together;
// caught (ErrAutocommit) where the transaction is checked.
func (c *cell[T]) afterCommitted() want {
	if c.checked() {
		return want{kind: wantCommitted, is: idempotent.ErrAutocommit, mustFail: true}
	}
	return want{kind: wantCommitted, why: "nothing checks the transaction before COMMIT in this mode: claim and effect committed together, unnoticed"}
}

// afterSwallowed is how a culprit that swallowed a failed statement must
// end, given what it read back through the transaction afterwards: a
// failed read is an aborted transaction (or the guard refusing the
// statement), its own effect read back is a live one, and no effect is a
// transaction the database rolled back and left.
func (c *cell[T]) afterSwallowed(o *observed) want {
	c.t.Helper()
	if o.err == nil {
		c.t.Fatal("the handler's statement did not fail")
	}
	switch {
	case o.readErr != nil:
		return want{kind: wantFailed, why: fmt.Sprintf("the transaction is aborted: %v, then %v", o.err, o.readErr)}
	case o.read == 1:
		return want{kind: wantApplied, why: fmt.Sprintf("the database kept the transaction: %v", o.err)}
	}
	if c.d.Guarded {
		c.t.Errorf("after %v the database ended the transaction, and GuardConnector let the handler's next statement run outside it", o.err)
	}
	if c.checked() {
		return want{kind: wantFailed, why: fmt.Sprintf("the database rolled the transaction back: %v", o.err)}
	}
	return want{kind: wantGone, why: fmt.Sprintf("the database rolled the transaction back (%v) and nothing checks it before COMMIT in this mode: open the database with GuardConnector, or use WithStrictGuard", o.err)}
}

// provoked fails the cell if the deadlock did not hit the handler.
func (c *cell[T]) provoked(o *observed) {
	c.t.Helper()
	if o.err == nil {
		c.t.Fatal("the handler's statement was not the deadlock's victim")
	}
}

// deadlock makes the handler's next statement the victim of a real
// deadlock with a transaction of the check's own, which holds counter
// lockRow and then asks for the handler's own counter while the handler
// asks for lockRow. The other transaction is made heavier, so that InnoDB
// picks the handler, and runs Harness.LateDeadlockCheck, so that Postgres's
// handler finds the deadlock first. It returns the handler's statement's
// error: the deadlock, or a lock wait bound that ended the wait first
// (Coalescing.LockWait).
func (c *cell[T]) deadlock(ctx context.Context, tx T, fx *Effects, own int, o *observed) error {
	actx := testContext(c.t) // not the handler's: the guard refuses it elsewhere
	o.adversary = make(chan struct{})
	adv, err := c.db.BeginTx(actx, nil)
	if err != nil {
		close(o.adversary)
		return fmt.Errorf("dialecttest: begin the other transaction: %w", err)
	}
	end := func() {
		_ = adv.Rollback()
		close(o.adversary)
	}
	var rows strings.Builder
	for i := range 200 {
		if i > 0 {
			rows.WriteString(", ")
		}
		fmt.Fprintf(&rows, "(%d)", i+1)
	}
	qs := []string{
		"INSERT INTO " + c.table + "_adv (id) VALUES " + rows.String(),
		fmt.Sprintf("UPDATE %s SET n = n WHERE id = %d", fx.Name(), lockRow),
	}
	if s := c.e.h.LateDeadlockCheck; s != "" {
		qs = append([]string{s}, qs...)
	}
	for _, q := range qs {
		if _, err := adv.ExecContext(actx, q); err != nil {
			end()
			return fmt.Errorf("dialecttest: the other transaction: %w", err)
		}
	}
	go func() {
		// It waits for the handler's counter until the victim's
		// transaction lets go of it.
		_, _ = adv.ExecContext(actx, fmt.Sprintf("UPDATE %s SET n = n WHERE id = %d", fx.Name(), own))
		end()
	}()
	return c.d.Exec(ctx, tx, fmt.Sprintf("UPDATE %s SET n = n WHERE id = %d", fx.Name(), lockRow))
}

// ReadSQL is the statement that reads counter id.
func (f *Effects) ReadSQL(id int) string {
	return fmt.Sprintf("SELECT n FROM %s WHERE id = %d", f.name, id)
}

// mistake runs one mistake cell.
func (c *cell[T]) mistake(mk mistake[T]) {
	const n = mistakeMessages
	k := culpritIndex
	if c.m.Batch {
		k = n - 1 // the batch function's mistake comes after the batch's effects
	}
	cfg := c.config(n)
	c.dl = c.deliverer(cfg)
	fx := c.e.NewEffects(c.t, c.db, c.table, lockRow)
	if strings.HasPrefix(mk.name, "Deadlock/") {
		adv := c.table + "_adv"
		dropAtEnd(c.t, c.db, adv)
		if _, err := c.db.Exec("CREATE TABLE " + adv + " (id INTEGER NOT NULL PRIMARY KEY)"); err != nil {
			c.t.Fatal(err)
		}
	}
	msgs := c.msgs("m1", "m2", "m3", "m4", "m5")
	o := &observed{}
	ctxs := make([]context.Context, n)
	ctxs[k], o.cancel = context.WithCancel(testContext(c.t))
	defer o.cancel()
	var runs [n]atomic.Int32
	good := func(i int) handler[T] { return c.bump(fx, i+1) }
	res := c.round(c.dl, msgs, func(i int) handler[T] {
		return func(ctx context.Context, tx T) error {
			if err := c.d.Exec(ctx, tx, fx.BumpSQL(i+1)); err != nil {
				return err
			}
			if i != k || runs[i].Add(1) > 1 {
				return nil
			}
			return mk.act(c, ctx, tx, fx, i+1, o)
		}
	}, ctxs)
	if o.adversary != nil {
		<-o.adversary
	}
	if runs[k].Load() == 0 {
		c.t.Fatalf("the culprit's handler never ran: %v", res)
	}
	w := mk.want(c, o)
	c.t.Logf("the culprit: %v; want %s", res[k], w.kind)
	if w.why != "" {
		c.t.Logf("because %s", w.why)
	}
	c.sameGroup(res, k)
	claims := c.claims()
	ended := func(i int, w want, who string) {
		c.t.Helper()
		r, key := res[i], msgs[i].Key
		effect, claim := fx.Get(c.t, i+1), claims[key]
		committed := effect == 1 && claim == 1
		nothing := effect == 0 && claim == 0
		bad := func(format string, args ...any) {
			c.t.Helper()
			c.t.Errorf("%s %s (%s; want %s): %s — effect %d, claims %d", who, key, r, w.kind, fmt.Sprintf(format, args...), effect, claim)
		}
		switch w.kind {
		case wantPanic:
			if r.panicked != panicValue || !nothing {
				bad("want its panic, and nothing committed")
			}
			return
		case wantApplied, wantDuplicate:
			out := idempotent.Applied
			if w.kind == wantDuplicate {
				out = idempotent.Duplicate
			}
			if r.err != nil || r.panicked != nil || r.out != out || !committed {
				bad("want %v with its claim and effect once", out)
			}
			return
		case wantRetried:
			if r.panicked != nil || !(r.err != nil && nothing || r.err == nil && r.out == idempotent.Applied && committed) {
				bad("want an error with nothing committed, or Applied once by a retry")
			}
			return
		}
		if r.panicked != nil {
			bad("a panic")
			return
		}
		if w.is != nil && r.err != nil && !errors.Is(r.err, w.is) {
			bad("the error does not match %v", w.is)
		}
		switch w.kind {
		case wantFailed:
			if r.err == nil || !nothing {
				bad("want an error and nothing committed")
			}
		case wantCommitted:
			if (r.err == nil && (w.mustFail || r.out != idempotent.Applied)) || !committed {
				bad("want its claim and effect committed together by the handler, and an error")
			}
		case wantGone:
			if (r.err == nil && (w.mustFail || r.out != idempotent.Applied)) || !nothing {
				bad("want nothing committed")
			}
			if r.err == nil {
				c.t.Logf("%s: Applied with nothing committed: the effect is lost (%s)", key, w.why)
			}
		}
	}
	for i := range res {
		switch {
		case i == k || c.m.Batch:
			ended(i, w, "the culprit's message")
		case res[i].out == idempotent.Duplicate && w.kind == wantCommitted && c.m.Coalesced && i < k:
			// The culprit committed the group's transaction, its own
			// and the earlier members' claims and effects with it.
			ended(i, want{kind: wantDuplicate}, "message")
		case res[i].err != nil:
			ended(i, want{kind: wantFailed}, "message")
		default:
			ended(i, want{kind: wantApplied}, "message")
		}
	}
	if got := fx.Get(c.t, escapeRow); got != w.escaped {
		c.t.Errorf("the write outside the transaction committed %d times, want %d", got, w.escaped)
	}
	if c.t.Failed() {
		return
	}
	c.settle(alone(cfg), msgs, res, good)
	lost := w.kind == wantGone && res[k].err == nil
	claims = c.claims()
	for i, m := range msgs {
		got, n := fx.Get(c.t, i+1), claims[m.Key]
		switch {
		case lost && (i == k || c.m.Batch):
			if got != 0 || n != 0 {
				c.t.Errorf("message %d (%s), lost as documented: effect %d, claims %d; want none", i, m.Key, got, n)
			}
		case got != 1 || n != 1:
			c.t.Errorf("message %d (%s) after redelivery: effect %d, claims %d; want exactly one of each", i, m.Key, got, n)
		}
	}
}
