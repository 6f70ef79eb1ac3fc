// Package coalesce is the transport-independent half of coalesced
// transactions (idempotent.WithCoalescing): it gathers concurrent
// ProcessMessage calls into groups, hands a group's transaction to each
// member's caller in turn so that its handler runs on the caller's own
// goroutine, and carries each member's final word back. What a group's
// transaction is — its statements, its claims, how a handler's failure is
// judged, its retries — is the caller's: the core's database/sql path and
// the pgx path (package idempgx) each run a closed group with Coalescer.Run.
//
// A member moves through the states below; the driver and the member race
// only on a compare-and-swap out of waiting, so a caller whose context ends
// either withdraws before the driver commits (its work is then rolled back
// and the group runs again without it) or waits for the COMMIT it can no
// longer stop.
//
// It is internal: only this repository's Middlewares run groups.
package coalesce

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

const (
	waiting    int32 = iota // may withdraw
	committing              // the driver is committing: wait for its word
	withdrawn               // the caller left; the driver drops it
	finished                // the driver has sent (or is sending) its final word
)

// Final is how a member's delivery ended: its outcome, or its error, or,
// when Alone is set, that its caller is to run the single-message path
// itself.
type Final[O any] struct {
	Alone    bool
	Outcome  O
	Attempts int
	Err      error
}

// Handled is how a member's handler ended: its error, or its panic.
type Handled struct {
	Err      error
	Panicked bool
	Value    any // the panic's value
}

// Member is one caller of ProcessMessage waiting in a group. T is the
// transaction a handler gets, O the outcome.
type Member[T, O any] struct {
	Ctx context.Context // the caller's
	Key string
	// Order is the message's ordering key, "" for none: a group holds at
	// most one member of an ordering key.
	Order string
	At    time.Time // the message's event time
	// Item is what the caller gave ProcessItem for the group's own use (a
	// delivery path's companion statement), nil from Process.
	Item any

	fn    func(context.Context, T) error
	state atomic.Int32
	in    chan turn[T, O] // from the driver: run the handler, or the final word; capacity 1
	ret   chan Handled    // to the driver: how the handler ended; capacity 1
	gone  chan struct{}   // closed when the member withdrew
}

// turn is what the driver hands a member: a transaction to run its handler
// in, with ctx (the caller's values and whatever the transport adds), or,
// when final is set, how the delivery ended.
type turn[T, O any] struct {
	ctx   context.Context
	tx    T
	final bool
	word  Final[O]
}

// Coalescer gathers concurrent calls into groups of at most Max, each
// closed when full or Wait after its first member arrived; Run runs a
// closed group of two or more members and must give each its final word
// (Finish). A group of one is told to go alone.
type Coalescer[T, O any] struct {
	Max  int
	Wait time.Duration
	Run  func(members []*Member[T, O])
	// Ready, when set, says how many callers may join a group at the
	// moment (a consumer's workers that have a message to deliver): a
	// group then closes as soon as it has that many members, without
	// waiting out Wait, and Flush closes an open group that has them.
	Ready func() int

	mu   sync.Mutex
	open *group[T, O] // the group accepting members, nil if none
	// later holds the members whose ordering key the open group has
	// already, in arrival order: they join the groups that follow.
	later []*Member[T, O]
}

// group is the members gathered for one transaction; full is closed when
// it has max members. orders holds its members' ordering keys.
type group[T, O any] struct {
	members []*Member[T, O]
	orders  map[string]bool
	full    chan struct{}
}

// Process joins a group on the caller's goroutine and runs fn whenever the
// group's driver hands it the transaction, until the driver's final word,
// which it returns. If ctx ends while the member may still withdraw, it
// withdraws and returns ctx's error as left. A panic of fn is re-raised
// here, after the driver has rolled its work back.
func (c *Coalescer[T, O]) Process(ctx context.Context, key string, at time.Time, fn func(context.Context, T) error) (word Final[O], left error) {
	return c.ProcessItem(ctx, key, at, nil, fn)
}

// ProcessItem is Process for a member carrying item (Member.Item).
func (c *Coalescer[T, O]) ProcessItem(ctx context.Context, key string, at time.Time, item any, fn func(context.Context, T) error) (word Final[O], left error) {
	return c.ProcessOrdered(ctx, key, "", at, item, fn)
}

// ProcessOrdered is ProcessItem for a member of ordering key order
// (Member.Order), "" for none: it joins the open group unless a member of
// the same ordering key is there already, and else the next group that
// has none.
func (c *Coalescer[T, O]) ProcessOrdered(ctx context.Context, key, order string, at time.Time, item any, fn func(context.Context, T) error) (word Final[O], left error) {
	mb := &Member[T, O]{Ctx: ctx, Key: key, Order: order, At: at, Item: item, fn: fn, in: make(chan turn[T, O], 1), ret: make(chan Handled, 1), gone: make(chan struct{})}
	c.join(mb)
	var panicked *Handled // the handler's panic, re-raised once the driver has rolled back
	for {
		var t turn[T, O]
		done := ctx.Done()
		if panicked != nil {
			done = nil // the panic waits for the rollback: the final word comes next
		}
		select {
		case t = <-mb.in:
		case <-done:
			if mb.withdraw() || mb.state.Load() == withdrawn {
				// It left, or the driver stopped waiting for it
				// (HandOrLeave).
				if panicked != nil {
					panic(panicked.Value)
				}
				return Final[O]{}, ctx.Err()
			}
			// The driver is committing, or has finished with this
			// member: its word comes next.
			for t = <-mb.in; !t.final; t = <-mb.in {
				mb.ret <- Handled{Err: ctx.Err()}
			}
		}
		if !t.final {
			h := mb.runHandler(t)
			if h.Panicked {
				panicked = &h
			}
			mb.ret <- h
			if mb.state.Load() == withdrawn {
				// The driver stopped waiting for this handler when ctx
				// ended (HandOrLeave), or it called runtime.Goexit: no
				// word comes.
				if panicked != nil {
					panic(panicked.Value)
				}
				return Final[O]{}, ctx.Err()
			}
			continue
		}
		if panicked != nil {
			panic(panicked.Value)
		}
		return t.word, nil
	}
}

// runHandler runs mb's handler in t's transaction, catching a panic, and a
// runtime.Goexit (t.FailNow in a test), which it tells the driver of itself.
func (mb *Member[T, O]) runHandler(t turn[T, O]) (h Handled) {
	ok := false
	defer func() {
		if ok {
			return
		}
		if v := recover(); v != nil {
			h = Handled{Panicked: true, Value: v}
			return
		}
		// runtime.Goexit: this goroutine ends here, the caller with it.
		if mb.state.CompareAndSwap(waiting, withdrawn) {
			mb.ret <- Handled{Err: errors.New("idempotent: the handler called runtime.Goexit")}
			close(mb.gone)
		}
	}()
	err := mb.fn(t.ctx, t.tx)
	ok = true
	return Handled{Err: err}
}

// join adds mb to the open group, opening one (and starting its driver) if
// there is none, and closes the group when mb fills it.
func (c *Coalescer[T, O]) join(mb *Member[T, O]) {
	c.mu.Lock()
	var lead []*group[T, O]
	if g := c.open; g != nil && mb.Order != "" && g.orders[mb.Order] {
		c.later = append(c.later, mb)
	} else {
		var full bool
		if lead, full = c.add(mb, nil); full {
			lead = c.closed(c.open, lead)
		}
	}
	c.mu.Unlock()
	c.start(lead)
}

// add adds mb to the open group, opening one if there is none (appended
// to lead: the caller starts the drivers of lead once it has unlocked
// c.mu), and reports whether the group is full. c.mu is held.
func (c *Coalescer[T, O]) add(mb *Member[T, O], lead []*group[T, O]) ([]*group[T, O], bool) {
	g := c.open
	if g == nil {
		g = &group[T, O]{full: make(chan struct{})}
		c.open = g
		lead = append(lead, g)
	}
	g.members = append(g.members, mb)
	if mb.Order != "" {
		if g.orders == nil {
			g.orders = map[string]bool{}
		}
		g.orders[mb.Order] = true
	}
	return lead, len(g.members) >= c.quorum()
}

// closed closes g, the open group, and moves the members that wait for the
// next group (later) into new groups, in arrival order, each group taking
// at most one member of an ordering key; it returns lead with the groups
// it opened. c.mu is held.
func (c *Coalescer[T, O]) closed(g *group[T, O], lead []*group[T, O]) []*group[T, O] {
	c.open = nil
	close(g.full)
	for len(c.later) > 0 && c.open == nil {
		later := c.later
		c.later = nil
		for i, mb := range later {
			if o := c.open; o != nil && mb.Order != "" && o.orders[mb.Order] {
				c.later = append(c.later, mb)
				continue
			}
			var full bool
			if lead, full = c.add(mb, lead); full {
				close(c.open.full)
				c.open = nil
				c.later = append(c.later, later[i+1:]...)
				break
			}
		}
	}
	return lead
}

// start starts the drivers of the groups opened.
func (c *Coalescer[T, O]) start(lead []*group[T, O]) {
	for _, g := range lead {
		go c.drive(g)
	}
}

// quorum is how many members close a group: Max, or fewer when Ready says
// fewer callers may join now.
func (c *Coalescer[T, O]) quorum() int {
	if c.Ready != nil {
		if n := c.Ready(); n >= 1 && n < c.Max {
			return n
		}
	}
	return c.Max
}

// Flush closes the open group if it has as many members as Ready says may
// join: the caller calls it when that count drops, so that the members
// waiting do not wait out Wait for one that will not come.
func (c *Coalescer[T, O]) Flush() {
	c.mu.Lock()
	var lead []*group[T, O]
	if g := c.open; g != nil && len(g.members) >= c.quorum() {
		lead = c.closed(g, nil)
	}
	c.mu.Unlock()
	c.start(lead)
}

// drive waits until g is full or its wait has passed, closes it, and runs
// it; a member left alone runs the single-message path itself.
func (c *Coalescer[T, O]) drive(g *group[T, O]) {
	t := time.NewTimer(c.Wait)
	select {
	case <-g.full:
	case <-t.C:
	}
	t.Stop()
	c.mu.Lock()
	var lead []*group[T, O]
	if c.open == g {
		lead = c.closed(g, nil)
	}
	members := g.members
	c.mu.Unlock()
	c.start(lead)
	if len(members) == 1 {
		members[0].Finish(Final[O]{Alone: true})
		return
	}
	c.Run(members)
}

// Finish gives mb its final word unless it withdrew.
func (mb *Member[T, O]) Finish(w Final[O]) {
	if mb.state.CompareAndSwap(waiting, finished) || mb.state.CompareAndSwap(committing, finished) {
		mb.in <- turn[T, O]{final: true, word: w}
	}
}

// Hand gives tx to mb's caller, which runs its handler with ctx, and
// returns how the handler ended; gone reports that the caller withdrew
// instead (its context ended, or the handler called runtime.Goexit).
func (mb *Member[T, O]) Hand(ctx context.Context, tx T) (h Handled, gone bool) {
	mb.Give(ctx, tx)
	return mb.Await()
}

// Give gives tx to mb's caller, which runs its handler with ctx, without
// waiting for it: a driver whose handlers touch nothing shared (the pgx
// path's WithQueuedOnly) gives every member its turn at once, so that
// their handlers run side by side, then awaits each. Every Give must be
// followed by Await before mb is given anything else.
func (mb *Member[T, O]) Give(ctx context.Context, tx T) {
	mb.in <- turn[T, O]{ctx: ctx, tx: tx}
}

// Await waits for the handler of the turn Give gave and returns how it
// ended; gone reports that the caller withdrew instead.
func (mb *Member[T, O]) Await() (h Handled, gone bool) {
	select {
	case h = <-mb.ret:
		return h, false
	case <-mb.gone:
		return Handled{}, true
	}
}

// HandOrLeave is Hand that does not wait for a handler past its caller's
// context (mb.Ctx): when that ends before the handler returns, mb
// withdraws at once and HandOrLeave reports gone, so that a handler that
// hangs without heeding its context cannot hold the group. The handler
// may then still be running, and using tx: the driver must end tx in a way
// that waits for the statement it may have in flight (database/sql's
// Tx.Rollback does) and never hand tx to another handler. The caller
// returns its context's error once its handler has returned.
func (mb *Member[T, O]) HandOrLeave(ctx context.Context, tx T) (h Handled, gone bool) {
	mb.in <- turn[T, O]{ctx: ctx, tx: tx}
	done := mb.Ctx.Done()
	for {
		select {
		case h = <-mb.ret:
			return h, false
		case <-mb.gone:
			return Handled{}, true
		case <-done:
			done = nil
			select {
			case h = <-mb.ret: // it returned meanwhile
				return h, false
			default:
			}
			if mb.withdraw() {
				return Handled{}, true
			}
		}
	}
}

// withdraw moves mb from waiting to withdrawn, and reports whether it did.
func (mb *Member[T, O]) withdraw() bool {
	if mb.state.CompareAndSwap(waiting, withdrawn) {
		close(mb.gone)
		return true
	}
	return false
}

// Commit marks mb committing: from here its caller waits for the COMMIT.
// It reports false when the caller withdrew first, whose work must then be
// rolled back with the rest.
func (mb *Member[T, O]) Commit() bool { return mb.state.CompareAndSwap(waiting, committing) }

// Uncommit takes back Commit when the COMMIT it announced never ran (the
// transaction failed before it and rolled back): mb may withdraw again.
func (mb *Member[T, O]) Uncommit() { mb.state.CompareAndSwap(committing, waiting) }

// Order sorts members by key, and by arrival among equal keys (the first
// arrival of a key is the one whose handler runs), those with an ordering
// key after those without, by ordering key (one of each in a group: the
// groups of several processes then lock the entities' sequence rows in
// one order, and wait for each other instead of deadlocking), and returns
// those that can share the group's transaction; when partitioned, a key given again
// with another event day (which would be claimed in another partition) is
// told to go alone, as it would without coalescing.
func Order[T, O any](members []*Member[T, O], partitioned bool) []*Member[T, O] {
	slices.SortStableFunc(members, func(a, b *Member[T, O]) int {
		return cmp.Or(strings.Compare(a.Order, b.Order), strings.Compare(a.Key, b.Key))
	})
	live := members[:0:0]
	for _, mb := range members {
		// Against the key's member kept before (the first of its key):
		// one told to go alone does not decide for the next.
		if n := len(live); partitioned && n > 0 && live[n-1].Key == mb.Key && !sameDay(live[n-1].At, mb.At) {
			mb.Finish(Final[O]{Alone: true})
			continue
		}
		live = append(live, mb)
	}
	return live
}

func sameDay(a, b time.Time) bool {
	ay, am, ad := a.UTC().Date()
	by, bm, bd := b.UTC().Date()
	return ay == by && am == bm && ad == bd
}

// Prune drops the members that withdrew or were finished, finishes those
// whose context ended (with wrap(key, its error)), and makes the rest
// waiting again (after a failed COMMIT they were committing).
func Prune[T, O any](live []*Member[T, O], wrap func(key string, err error) error) []*Member[T, O] {
	out := live[:0]
	for _, mb := range live {
		mb.state.CompareAndSwap(committing, waiting)
		if mb.state.Load() != waiting {
			continue
		}
		if err := mb.Ctx.Err(); err != nil {
			mb.Finish(Final[O]{Err: wrap(mb.Key, err)})
			continue
		}
		out = append(out, mb)
	}
	return out
}

// Pass is what one transaction of a group tells the driver.
type Pass[T, O any] struct {
	Outcomes []O // per live member, when the transaction committed
	// ClaimFailed reports that the group's claims failed for good in a
	// way no one member can be blamed for; CommitFailed that its COMMIT
	// failed for a reason that is not retried (a deferred constraint, say).
	// Either sends every member to a transaction of its own.
	ClaimFailed, CommitFailed bool

	failed   []*Member[T, O] // members that failed on their own
	failures []Final[O]      // their final words
}

// Fail records that mb failed on its own, with w its final word: the
// driver gives it once the transaction has ended.
func (p *Pass[T, O]) Fail(mb *Member[T, O], w Final[O]) {
	p.failed, p.failures = append(p.failed, mb), append(p.failures, w)
}

// Driver runs closed groups: one transaction after another (Once) under
// the retry policy (Retry) until one commits or the group fails, then every
// member's final word.
type Driver[T, O any] struct {
	// Retry runs attempt under the Middleware's retry policy
	// (idempotent.RetryPolicy.Run, with its observer's retry hook) and
	// returns the attempts made and the last failure.
	Retry func(attempt func(ctx context.Context) (dialect.Class, error)) (int, error)
	// Once runs one transaction of live, in key order, recording in p.
	// After a member failed on its own or withdrew it rolls back and
	// returns an error for which Regroup holds: the group runs again at
	// once without that member, in the same attempt.
	Once    func(ctx context.Context, live []*Member[T, O], p *Pass[T, O]) (dialect.Class, error)
	Regroup func(err error) bool
	// Wrap wraps a member's failure as its ProcessMessage wraps its own.
	Wrap func(key string, err error) error
	// Exhausted reports whether err is the retry policy giving up
	// (idempotent.RetriesExhaustedError).
	Exhausted func(err error) bool
	// Start, when set, is called before each transaction of the group
	// with ctx and the members it runs, in key order: it returns the
	// context the transaction runs with (a tracer's span of the
	// transaction) and end, called once with how the transaction ended:
	// nil when it committed, else the error Once returned.
	Start func(ctx context.Context, live []*Member[T, O]) (context.Context, func(error))
}

// Run runs a closed group of members to the end: every member gets its
// final word. A group whose claims failed for good (Pass.ClaimFailed) or
// whose COMMIT failed for a reason that is not retried
// (Pass.CommitFailed) sends each member to a transaction of its own,
// which finds out which of them it was.
func (d *Driver[T, O]) Run(members []*Member[T, O], partitioned bool) {
	live := Order(members, partitioned)
	var (
		outcomes []O
		alone    bool
	)
	attempts, err := d.Retry(func(ctx context.Context) (dialect.Class, error) {
		for {
			live = Prune(live, d.Wrap)
			if len(live) == 0 {
				outcomes = nil
				return dialect.Class{}, nil
			}
			var p Pass[T, O]
			tctx, end := ctx, func(error) {}
			if d.Start != nil {
				tctx, end = d.Start(ctx, live)
			}
			class, err := d.Once(tctx, live, &p)
			end(err)
			for i, mb := range p.failed {
				mb.Finish(p.failures[i])
			}
			if d.Regroup(err) {
				continue // rolled back: again, without the failed
			}
			outcomes, alone = p.Outcomes, p.ClaimFailed || p.CommitFailed
			return class, err
		}
	})
	for i, mb := range live {
		switch {
		case err == nil:
			mb.Finish(Final[O]{Outcome: outcomes[i], Attempts: attempts})
		case alone && !d.Exhausted(err):
			mb.Finish(Final[O]{Alone: true})
		default:
			mb.Finish(Final[O]{Attempts: attempts, Err: d.Wrap(mb.Key, err)})
		}
	}
}
