package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
)

// coalesced is the outcome of one coalesced ProcessMessage call.
type coalesced struct {
	outcome  idempotent.Outcome
	err      error
	panicked any
}

type callerKey struct{}

// runGroup calls ProcessMessage once per key, concurrently, on a Middleware
// whose groups close when they have len(keys) members (the wait is long
// enough never to end one first; an option of opts may replace that bound),
// and returns each call's result by key.
// Each call's context carries its key under callerKey, and fn(key) is its
// handler.
func runGroup(t *testing.T, r *recorded, keys []string, fn func(key string) idempotent.TxFunc, opts ...idempotent.Option) map[string]coalesced {
	t.Helper()
	opts = append([]idempotent.Option{idempotent.WithCoalescing(idempotent.Coalescing{Max: len(keys), Wait: time.Second, LockWait: -1})}, opts...)
	mw := newMiddleware(t, r, opts...)
	var mu sync.Mutex
	got := map[string]coalesced{}
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res coalesced
			defer func() {
				res.panicked = recover()
				mu.Lock()
				got[fmt.Sprint(i, k)] = res
				mu.Unlock()
			}()
			ctx := context.WithValue(context.Background(), callerKey{}, k)
			res.outcome, res.err = mw.ProcessMessage(ctx, idempotent.Message{Key: k}, fn(k))
		}()
	}
	wg.Wait()
	return got
}

// The optimistic design's statements on Postgres (dialect.TxFencer): a
// group's transaction is fenced by a random token from just before its
// first handler.
var (
	fenceSQL       = pg.TxFenceSQL(0)
	fenceCheckSQL  = pg.TxFenceCheckSQL()
	fencedClaimSQL = pg.TxFencedClaimSQL(dialect.Table{Name: idempotent.DefaultTable}, false, false)
)

// fenceToken is a sqlmock.Argument matching a group transaction's fence
// token: any value the first time, then only that value.
type fenceToken struct {
	mu sync.Mutex
	v  driver.Value
}

func (f *fenceToken) Match(v driver.Value) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.v == nil {
		f.v = v
		return v != nil && v != ""
	}
	return v == f.v
}

// groupTx scripts one transaction of a group in the optimistic design:
// BEGIN, then each member's claim — plain until a handler has run,
// fenced after — the fence before the first handler (with waitSQL, the
// fence statement for the group's lock wait bound), and the check.
type groupTx struct {
	m       sqlmock.Sqlmock
	tok     *fenceToken
	fenced  bool
	waitSQL string
}

func beginGroup(m sqlmock.Sqlmock) *groupTx {
	m.ExpectBegin()
	return &groupTx{m: m, tok: &fenceToken{}, waitSQL: fenceSQL}
}

// claim scripts k's claim inserting rows (1 or 0), and the fence after the
// first new one.
func (g *groupTx) claim(k string, rows int64) {
	if g.fenced {
		g.m.ExpectExec(fencedClaimSQL).WithArgs(consumer, k, g.tok).WillReturnResult(sqlmock.NewResult(0, rows))
		return
	}
	expectClaim(g.m, k, rows)
	if rows == 1 {
		g.m.ExpectExec(g.waitSQL).WithArgs(g.tok).WillReturnResult(sqlmock.NewResult(0, 0))
		g.fenced = true
	}
}

// claimError scripts k's claim failing with err.
func (g *groupTx) claimError(k string, err error) {
	if g.fenced {
		g.m.ExpectExec(fencedClaimSQL).WithArgs(consumer, k, g.tok).WillReturnError(err)
		return
	}
	expectClaimError(g.m, k, err)
}

// check scripts the check after the last handler, failing with err if not
// nil.
func (g *groupTx) check(err error) {
	e := g.m.ExpectExec(fenceCheckSQL).WithArgs(g.tok)
	if err != nil {
		e.WillReturnError(err)
		return
	}
	e.WillReturnResult(sqlmock.NewResult(0, 0))
}

// expectGroup scripts a whole transaction of a group whose members, keys,
// are all new and apply effectSQL: BEGIN, each claim and effect, the
// check, COMMIT.
func expectGroup(m sqlmock.Sqlmock, keys ...string) {
	g := beginGroup(m)
	for _, k := range keys {
		g.claim(k, 1)
		expectEffect(m)
	}
	g.check(nil)
	m.ExpectCommit()
}

// fenceBroken is Postgres's answer to a fenced statement outside the
// transaction the fence marked: the fence's division by zero.
var fenceBroken = &pq.Error{Code: "22012", Message: "division by zero"}

// ownEffect is a handler that checks it runs with its own caller's context
// and applies effectSQL.
func ownEffect(t *testing.T, key string) idempotent.TxFunc {
	return func(ctx context.Context, tx *sql.Tx) error {
		if got := ctx.Value(callerKey{}); got != key {
			t.Errorf("the handler of %q ran with the context of %v", key, got)
		}
		return effect(ctx, tx)
	}
}

func TestCoalescing(t *testing.T) {
	t.Run("one transaction: claims in key order, each just before its handler, fenced after the first handler; one commit", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 0)
		g.claim("c", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"c", "b", "a"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(context.Context, *sql.Tx) error { t.Error("a duplicate's handler ran"); return nil }
			}
			return ownEffect(t, k)
		})
		want := map[string]coalesced{"0c": {outcome: idempotent.Applied}, "1b": {outcome: idempotent.Duplicate}, "2a": {outcome: idempotent.Applied}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a group of duplicates: plain claims, no fence, rolled back", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 0)
		g.claim("b", 0)
		r.mock.ExpectRollback()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			return func(context.Context, *sql.Tx) error { t.Error("a duplicate's handler ran"); return nil }
		})
		if got["0a"].outcome != idempotent.Duplicate || got["1b"].outcome != idempotent.Duplicate {
			t.Fatalf("got %v, want both duplicates", got)
		}
		r.wantCalls(t, "BEGIN", claimSQL, claimSQL, "ROLLBACK")
	})
	t.Run("a key twice in a group: one claim, one handler run", func(t *testing.T) {
		r := newRecorded(t)
		expectGroup(r.mock, "a")
		got := runGroup(t, r, []string{"a", "a"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) })
		outs := []idempotent.Outcome{got["0a"].outcome, got["1a"].outcome}
		slices.Sort(outs)
		if !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate}) || got["0a"].err != nil || got["1a"].err != nil {
			t.Fatalf("got %v, want one applied and one duplicate", got)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a handler's failure fails its message alone: rolled back, the others run again without it, the later ones never claimed", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "a", "c")
		bad := errors.New("bad payload")
		got := runGroup(t, r, []string{"a", "b", "c"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(context.Context, *sql.Tx) error { return bad }
			}
			return ownEffect(t, k)
		})
		if got["0a"].outcome != idempotent.Applied || got["2c"].outcome != idempotent.Applied || got["0a"].err != nil || got["2c"].err != nil {
			t.Fatalf("got %v, want a and c applied", got)
		}
		if b := got["1b"]; !errors.Is(b.err, bad) || b.outcome != 0 || errors.Is(b.err, idempotent.ErrAutocommit) {
			t.Fatalf("b got %v, want its own error", b)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, "ROLLBACK",
			"BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a panicking handler: the panic reaches its caller after the rollback, the others commit", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(context.Context, *sql.Tx) error { panic("boom") }
			}
			return ownEffect(t, k)
		})
		if got["0a"].panicked != "boom" || got["1b"].outcome != idempotent.Applied || got["1b"].panicked != nil {
			t.Fatalf("got %v, want a's panic and b applied", got)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, "ROLLBACK", "BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a handler that calls runtime.Goexit leaves the group, which goes on without it", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(context.Context, *sql.Tx) error { runtime.Goexit(); return nil }
			}
			return ownEffect(t, k)
		})
		if got["0a"].outcome != 0 || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want a gone and b applied", got)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, "ROLLBACK", "BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a failed commit is retried for the whole group", func(t *testing.T) {
		r := newRecorded(t)
		for _, commitErr := range []error{&pq.Error{Code: "40001"}, nil} {
			g := beginGroup(r.mock)
			g.claim("a", 1)
			expectEffect(r.mock)
			g.claim("b", 1)
			expectEffect(r.mock)
			g.check(nil)
			r.mock.ExpectCommit().WillReturnError(commitErr)
		}
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) })
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
		once := []string{"BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "COMMIT"}
		r.wantCalls(t, append(once, once...)...)
	})
	t.Run("a serialization failure in a handler's statement is the group's: retried for all", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		r.mock.ExpectExec(effectSQL).WithoutArgs().WillReturnError(&pq.Error{Code: "40001"})
		expectProbe(r.mock, aborted)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "a", "b")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) })
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
	})
	t.Run("a caller whose context ends mid-group gets its error; its work is rolled back", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, LockWait: -1}))
		actx, cancel := context.WithCancel(context.Background())
		defer cancel()
		aDone := make(chan error, 1)
		bRan := make(chan struct{}, 2)
		bGo := make(chan struct{})
		runs := 0 // b's handler runs, on b's goroutine
		go func() {
			_, err := mw.ProcessMessage(actx, idempotent.Message{Key: "a"}, effect)
			aDone <- err
		}()
		var bOut idempotent.Outcome
		var bErr error
		bFinished := make(chan struct{})
		go func() {
			defer close(bFinished)
			bOut, bErr = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "b"}, func(ctx context.Context, tx *sql.Tx) error {
				bRan <- struct{}{}
				if runs++; runs == 1 {
					<-bGo // the first run: hold the group until a's caller has left
				}
				return effect(ctx, tx)
			})
		}()
		<-bRan
		cancel()
		if err := <-aDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("a got %v, want context.Canceled", err)
		}
		close(bGo)
		<-bFinished
		if bErr != nil || bOut != idempotent.Applied {
			t.Fatalf("b got (%v, %v), want applied", bOut, bErr)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "ROLLBACK",
			"BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a call left alone runs as without the option", func(t *testing.T) {
		r := newRecorded(t)
		expectApplied(r.mock, key)
		mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 8, Wait: time.Microsecond}))
		if out, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || out != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", out, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("a handler's nested ProcessMessage is refused", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		var nested error
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(ctx context.Context, tx *sql.Tx) error {
					nested = idempotent.RunTx(ctx, r.db, pg, nil, idempotent.DefaultRetryPolicy(), effect)
					return nil // swallowed: the guard remembers
				}
			}
			return ownEffect(t, k)
		})
		if !errors.Is(nested, idempotent.ErrAutocommit) || !errors.Is(got["0a"].err, idempotent.ErrAutocommit) || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v (nested %v), want a failed with ErrAutocommit and b applied", got, nested)
		}
	})
}

// TestCoalescingFence: a handler that breaks the group's transaction fails
// alone, found by the next fenced statement, and the other members run
// again; a claim or a COMMIT that fails for good concerns its member or
// sends each alone; a handler that hangs past its context does not hold
// the group.
func TestCoalescingFence(t *testing.T) {
	t.Run("the next member's fenced claim finds the transaction ended: the handler before fails alone, loudly", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claimError("b", fenceBroken)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) })
		a := got["0a"]
		if !errors.Is(a.err, idempotent.ErrAutocommit) || !strings.Contains(a.err.Error(), "CLAIM MAY HAVE COMMITTED") || a.outcome != 0 {
			t.Fatalf("a got %v, want ErrAutocommit saying its claim may have committed", a)
		}
		if b := got["1b"]; b.err != nil || b.outcome != idempotent.Applied {
			t.Fatalf("b got %v, want applied in a transaction of its own", b)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, "ROLLBACK",
			"BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("the check before COMMIT finds the transaction aborted: the last handler fails alone", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		r.mock.ExpectExec(effectSQL).WithoutArgs().WillReturnError(&pq.Error{Code: "23505"})
		g.check(aborted)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "a")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(ctx context.Context, tx *sql.Tx) error {
					_ = effect(ctx, tx) // swallowed
					return nil
				}
			}
			return ownEffect(t, k)
		})
		if b := got["1b"]; !errors.Is(b.err, idempotent.ErrAutocommit) || b.outcome != 0 {
			t.Fatalf("b got %v, want ErrAutocommit", b)
		}
		if a := got["0a"]; a.err != nil || a.outcome != idempotent.Applied {
			t.Fatalf("a got %v, want applied", a)
		}
	})
	t.Run("a handler's own tx.Commit: the next claim is never sent, the others run again", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit() // the handler's
		expectGroup(r.mock, "b")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(ctx context.Context, tx *sql.Tx) error {
					if err := effect(ctx, tx); err != nil {
						return err
					}
					return tx.Commit()
				}
			}
			return ownEffect(t, k)
		})
		if a := got["0a"]; !errors.Is(a.err, idempotent.ErrAutocommit) || a.outcome != 0 {
			t.Fatalf("a got %v, want ErrAutocommit", a)
		}
		if b := got["1b"]; b.err != nil || b.outcome != idempotent.Applied {
			t.Fatalf("b got %v, want applied", b)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, "COMMIT", "BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("a claim that fails for good concerns its member only: it goes alone, the others run again", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.MatchExpectationsInOrder(false) // b alone runs while the group runs again
		lockSQL := pg.LockTimeoutSQL(time.Second)
		expectLock := func() { r.mock.ExpectExec(lockSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0)) }
		g := beginGroup(r.mock)
		expectLock()
		g.claim("a", 1)
		expectEffect(r.mock)
		expectLock()
		g.claimError("b", &pq.Error{Code: "55P03", Message: "canceling statement due to lock timeout"})
		r.mock.ExpectRollback()
		g = beginGroup(r.mock)
		expectLock()
		g.claim("a", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectCommit()
		r.mock.ExpectBegin() // b alone
		expectLock()
		expectClaim(r.mock, "b", 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) }, idempotent.WithLockTimeout(time.Second))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied || got["0a"].err != nil || got["1b"].err != nil {
			t.Fatalf("got %v (b: %v), want both applied, b alone", got, got["1b"].err)
		}
		first := []string{"BEGIN", lockSQL, claimSQL, fenceSQL, effectSQL, lockSQL, fencedClaimSQL, "ROLLBACK"}
		if calls := r.calls(); len(calls) != len(first)+7+5 || !slices.Equal(calls[:len(first)], first) {
			t.Fatalf("calls %q, want %q, then the group again and b alone", calls, first)
		}
	})
	t.Run("a COMMIT that fails for good sends every member alone, each to its own outcome", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.MatchExpectationsInOrder(false) // the members' own transactions run at once
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectCommit().WillReturnError(&pq.Error{Code: "23505", Message: "deferred unique violation"})
		for _, k := range []string{"a", "b"} {
			r.mock.ExpectBegin()
			expectClaim(r.mock, k, 1)
			expectEffect(r.mock)
			r.mock.ExpectCommit()
		}
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return effect })
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied || got["0a"].err != nil || got["1b"].err != nil {
			t.Fatalf("got %v, want both applied alone", got)
		}
		if calls := r.calls(); len(calls) != 8+2*4 || !slices.Equal(calls[:8], []string{"BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "COMMIT"}) {
			t.Fatalf("calls %q, want the group's transaction, then one of each member's", calls)
		}
	})
	t.Run("a handler that hangs past its context does not hold the group", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		r.mock.ExpectRollback()
		expectGroup(r.mock, "b")
		mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, LockWait: -1}))
		actx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hung, release := make(chan struct{}), make(chan struct{})
		aDone := make(chan error, 1)
		go func() {
			_, err := mw.ProcessMessage(actx, idempotent.Message{Key: "a"}, func(ctx context.Context, tx *sql.Tx) error {
				close(hung)
				<-release // heeds no context
				return nil
			})
			aDone <- err
		}()
		bDone := make(chan error, 1)
		go func() {
			out, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "b"}, effect)
			if err == nil && out != idempotent.Applied {
				err = fmt.Errorf("outcome %v, want applied", out)
			}
			bDone <- err
		}()
		<-hung
		cancel()
		if err := <-bDone; err != nil { // while a's handler still hangs
			t.Fatalf("b: %v", err)
		}
		close(release)
		if err := <-aDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("a got %v, want context.Canceled", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, "ROLLBACK", "BEGIN", claimSQL, fenceSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
}

func TestCoalescingWithSavepoints(t *testing.T) {
	sp := func(n int) idempotent.Option {
		return idempotent.WithCoalescing(idempotent.Coalescing{Max: n, Wait: time.Second, Savepoints: true, LockWait: -1})
	}
	expectSP := func(m sqlmock.Sqlmock, q string) {
		m.ExpectExec(q).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	}
	// A member's RELEASE rides with the next member's SAVEPOINT.
	releaseSP := pg.JoinSQL(dialect.MessageReleaseSQL, dialect.MessageSavepointSQL)
	// expectMember scripts a new member whose handler applies the effect:
	// SAVEPOINT, its claim, the effect, RELEASE.
	expectMember := func(m sqlmock.Sqlmock, k string) {
		expectSP(m, dialect.MessageSavepointSQL)
		expectClaim(m, k, 1)
		expectEffect(m)
		expectSP(m, dialect.MessageReleaseSQL)
	}
	t.Run("a swallowed error that aborted the transaction: the RELEASE fails, the member is rolled back to its savepoint and fails alone, the others go on", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "a", 1)
		r.mock.ExpectExec(effectSQL).WithoutArgs().WillReturnError(&pq.Error{Code: "23505"})
		r.mock.ExpectExec(releaseSP).WithoutArgs().WillReturnError(aborted)
		expectSP(r.mock, dialect.MessageRollbackSQL)
		expectMember(r.mock, "b")
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(ctx context.Context, tx *sql.Tx) error {
					_ = effect(ctx, tx) // swallowed
					return nil
				}
			}
			return ownEffect(t, k)
		}, sp(2))
		if a := got["0a"]; !errors.Is(a.err, idempotent.ErrAutocommit) || strings.Contains(a.err.Error(), "MAY HAVE COMMITTED") {
			t.Fatalf("a got %v, want ErrAutocommit saying its work is rolled back", a)
		}
		if b := got["1b"]; b.err != nil || b.outcome != idempotent.Applied {
			t.Fatalf("b got %v, want applied in the same transaction", b)
		}
	})
	t.Run("a handler that ended the transaction: RELEASE and the rollback to its savepoint fail; it fails alone, loudly, the others run again", func(t *testing.T) {
		r := newRecorded(t)
		ended := &pq.Error{Code: "25P01", Message: "RELEASE SAVEPOINT can only be used in transaction blocks"}
		r.mock.ExpectBegin()
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "a", 1)
		expectEffect(r.mock)
		r.mock.ExpectExec(releaseSP).WithoutArgs().WillReturnError(ended)
		r.mock.ExpectExec(dialect.MessageRollbackSQL).WithoutArgs().WillReturnError(ended)
		r.mock.ExpectRollback()
		r.mock.ExpectBegin()
		expectMember(r.mock, "b")
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) }, sp(2))
		if a := got["0a"]; !errors.Is(a.err, idempotent.ErrAutocommit) || !strings.Contains(a.err.Error(), "MAY HAVE COMMITTED") {
			t.Fatalf("a got %v, want ErrAutocommit saying its claim may have committed", a)
		}
		if b := got["1b"]; b.err != nil || b.outcome != idempotent.Applied {
			t.Fatalf("b got %v, want applied", b)
		}
	})
	t.Run("a claim that fails for good: rolled back to its savepoint, the others go on, and it runs alone", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaimError(r.mock, "a", &pq.Error{Code: "42501", Message: "permission denied"})
		expectSP(r.mock, dialect.MessageRollbackSQL)
		expectMember(r.mock, "b")
		r.mock.ExpectCommit()
		expectApplied(r.mock, "a") // alone, after the group's COMMIT
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) }, sp(2))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied, a alone", got)
		}
		r.wantCalls(t, "BEGIN", dialect.MessageSavepointSQL, claimSQL, dialect.MessageRollbackSQL,
			dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageReleaseSQL, "COMMIT",
			"BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("each message's claim and handler under a savepoint of its own", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "a", 1)
		expectEffect(r.mock)
		expectSP(r.mock, releaseSP)
		expectClaim(r.mock, "b", 0)
		expectSP(r.mock, dialect.MessageReleaseSQL)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(context.Context, *sql.Tx) error { t.Error("a duplicate's handler ran"); return nil }
			}
			return ownEffect(t, k)
		}, sp(2))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Duplicate {
			t.Fatalf("got %v, want a applied, b duplicate", got)
		}
		r.wantCalls(t, "BEGIN", dialect.MessageSavepointSQL, claimSQL, effectSQL, releaseSP,
			claimSQL, dialect.MessageReleaseSQL, "COMMIT")
	})
	t.Run("a failed or panicking handler rolls back to its savepoint, claim and all; the others do not run again", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "a", 1)
		r.mock.ExpectExec(effectSQL).WithoutArgs().WillReturnError(&pq.Error{Code: "23505"})
		expectSP(r.mock, dialect.MessageRollbackSQL)
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "b", 1)
		expectSP(r.mock, dialect.MessageRollbackSQL)
		expectSP(r.mock, dialect.MessageSavepointSQL)
		expectClaim(r.mock, "c", 1)
		expectEffect(r.mock)
		expectSP(r.mock, dialect.MessageReleaseSQL)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b", "c"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(context.Context, *sql.Tx) error { panic("boom") }
			}
			return ownEffect(t, k)
		}, sp(3))
		var pqErr *pq.Error
		if !errors.As(got["0a"].err, &pqErr) || got["1b"].panicked != "boom" || got["2c"].outcome != idempotent.Applied || got["2c"].err != nil {
			t.Fatalf("got %v, want a's error, b's panic, c applied", got)
		}
		r.wantCalls(t, "BEGIN", dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageRollbackSQL,
			dialect.MessageSavepointSQL, claimSQL, dialect.MessageRollbackSQL,
			dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageReleaseSQL, "COMMIT")
	})
}

func TestCoalescingKeepsTheSinglePathsOptions(t *testing.T) {
	expectTxID := func(m sqlmock.Sqlmock, id string) {
		m.ExpectQuery(txidSQL).WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(id))
	}
	lockSQL := pg.LockTimeoutSQL(time.Second)
	guards := []idempotent.Option{idempotent.WithStrictGuard(), idempotent.WithLockTimeout(time.Second)}
	t.Run("lock timeout around each claim; the strict guard after the first claim, every handler and before COMMIT", func(t *testing.T) {
		r := newRecorded(t)
		expectLock := func() { r.mock.ExpectExec(lockSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0)) }
		g := beginGroup(r.mock)
		expectLock()
		expectClaim(r.mock, "a", 1)
		expectTxID(r.mock, "77")
		r.mock.ExpectExec(fenceSQL).WithArgs(g.tok).WillReturnResult(sqlmock.NewResult(0, 0))
		g.fenced = true
		expectEffect(r.mock)
		expectTxID(r.mock, "77")
		expectLock()
		g.claim("b", 1)
		expectEffect(r.mock)
		expectTxID(r.mock, "77")
		g.check(nil)
		expectTxID(r.mock, "77")
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) }, guards...)
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
		r.wantCalls(t, "BEGIN", lockSQL, claimSQL, txidSQL, fenceSQL, effectSQL, txidSQL, lockSQL, fencedClaimSQL, effectSQL, txidSQL, fenceCheckSQL, txidSQL, "COMMIT")
	})
	// expectFirst scripts a transaction's start up to its first handler:
	// BEGIN, the lock timeout, a's claim, the strict guard's first reading
	// (77) and the fence.
	expectFirst := func(r *recorded, k string) *groupTx {
		g := beginGroup(r.mock)
		r.mock.ExpectExec(lockSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
		expectClaim(r.mock, k, 1)
		expectTxID(r.mock, "77")
		r.mock.ExpectExec(fenceSQL).WithArgs(g.tok).WillReturnResult(sqlmock.NewResult(0, 0))
		g.fenced = true
		return g
	}
	t.Run("a handler that left the transaction fails alone with ErrAutocommit; the others run again", func(t *testing.T) {
		r := newRecorded(t)
		expectFirst(r, "a")
		expectEffect(r.mock)
		expectTxID(r.mock, "78") // a's handler committed behind the middleware's back
		r.mock.ExpectRollback()
		g := expectFirst(r, "b")
		expectEffect(r.mock)
		expectTxID(r.mock, "77")
		g.check(nil)
		expectTxID(r.mock, "77")
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) }, guards...)
		if !errors.Is(got["0a"].err, idempotent.ErrAutocommit) || got["1b"].err != nil || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want ErrAutocommit for a, b applied", got)
		}
	})
	t.Run("a handler that left the transaction and then failed fails alone with ErrAutocommit and its error", func(t *testing.T) {
		r := newRecorded(t)
		expectFirst(r, "a")
		expectTxID(r.mock, "78") // a's handler committed, then failed
		r.mock.ExpectRollback()
		g := expectFirst(r, "b")
		expectEffect(r.mock)
		expectTxID(r.mock, "77")
		g.check(nil)
		expectTxID(r.mock, "77")
		r.mock.ExpectCommit()
		bad := errors.New("the effect failed")
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(context.Context, *sql.Tx) error { return bad }
			}
			return ownEffect(t, k)
		}, guards...)
		if !errors.Is(got["0a"].err, idempotent.ErrAutocommit) || !errors.Is(got["0a"].err, bad) || got["1b"].err != nil || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want ErrAutocommit and its own error for a, b applied", got)
		}
		r.wantCalls(t, "BEGIN", lockSQL, claimSQL, txidSQL, fenceSQL, txidSQL, "ROLLBACK",
			"BEGIN", lockSQL, claimSQL, txidSQL, fenceSQL, effectSQL, txidSQL, fenceCheckSQL, txidSQL, "COMMIT")
	})
	t.Run("the retention fence refuses a message before it joins a group", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second}))
		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "a", EventTime: time.Now().Add(-365 * 24 * time.Hour)}, effect)
		if !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Fatalf("got %v, want ErrBeyondRetention", err)
		}
		r.wantCalls(t)
	})
}

func TestWithCoalescingRefusesBadBounds(t *testing.T) {
	r := newRecorded(t)
	for _, c := range []idempotent.Coalescing{{Max: 1, Wait: time.Millisecond}, {Max: idempotent.MaxBatchSize + 1, Wait: time.Millisecond}, {Max: 8}, {Max: 8, Wait: 2 * time.Second}} {
		if _, err := idempotent.New(r.db, pg, consumer, idempotent.WithCoalescing(c)); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
	mw, err := idempotent.New(r.db, pg, consumer, idempotent.WithCoalescing(idempotent.Coalescing{Max: 8, Wait: time.Millisecond}))
	if err != nil || mw.Config().Coalescing != (idempotent.Coalescing{Max: 8, Wait: time.Millisecond}) {
		t.Fatalf("got (%+v, %v)", mw.Config().Coalescing, err)
	}
}

// TestCoalescingLockWait scripts the lock wait bound of a group: set once
// after the group's claims (optimistic) or after BEGIN (savepoints), and a
// handler whose statement ran out of it leaves the group and runs alone.
func TestCoalescingLockWait(t *testing.T) {
	waitSQL := pg.LockTimeoutSQL(idempotent.DefaultLockWait)
	t.Run("optimistic: the default bound, once, with the fence before the first handler", func(t *testing.T) {
		r := newRecorded(t)
		fenceWaitSQL := pg.TxFenceSQL(idempotent.DefaultLockWait)
		g := beginGroup(r.mock)
		g.waitSQL = fenceWaitSQL
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) },
			idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second}))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceWaitSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, "COMMIT")
	})
	t.Run("savepoints: a handler past the bound leaves the group and runs alone after its COMMIT", func(t *testing.T) {
		r := newRecorded(t)
		expectSP := func(q string) { r.mock.ExpectExec(q).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0)) }
		r.mock.ExpectBegin()
		expectSP(pg.JoinSQL(waitSQL, dialect.MessageSavepointSQL)) // the bound rides with the first SAVEPOINT
		expectClaim(r.mock, "a", 1)
		r.mock.ExpectExec(effectSQL).WithoutArgs().WillReturnError(&pq.Error{Code: "55P03", Message: "canceling statement due to lock timeout"})
		expectSP(dialect.MessageRollbackSQL)
		expectSP(dialect.MessageSavepointSQL)
		expectClaim(r.mock, "b", 1)
		expectEffect(r.mock)
		expectSP(dialect.MessageReleaseSQL)
		r.mock.ExpectCommit()
		expectApplied(r.mock, "a") // alone: BEGIN, claim, effect, COMMIT
		ev := &events{}
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) },
			idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: true, LockWait: idempotent.DefaultLockWait}),
			idempotent.WithObserver(ev))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
		r.wantCalls(t, "BEGIN", pg.JoinSQL(waitSQL, dialect.MessageSavepointSQL), claimSQL, effectSQL, dialect.MessageRollbackSQL,
			dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageReleaseSQL, "COMMIT",
			"BEGIN", claimSQL, effectSQL, "COMMIT")
		if len(ev.retries) != 1 || ev.retries[0].Key != "a" || ev.retries[0].Reason != "lock_timeout" || ev.retries[0].Code != "55P03" {
			t.Errorf("observer heard retries %+v, want a's lock timeout", ev.retries)
		}
	})
	t.Run("savepoints with WithLockTimeout: the group's bound again after each claim's own", func(t *testing.T) {
		r := newRecorded(t)
		lockSQL := pg.LockTimeoutSQL(time.Second)
		expectSP := func(q string) { r.mock.ExpectExec(q).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0)) }
		r.mock.ExpectBegin()
		first, next := pg.JoinSQL(waitSQL, dialect.MessageSavepointSQL), pg.JoinSQL(dialect.MessageReleaseSQL, dialect.MessageSavepointSQL)
		for _, sp := range []string{first, next} {
			expectSP(sp)
			expectSP(lockSQL)
			r.mock.ExpectExec(claimSQL).WillReturnResult(sqlmock.NewResult(0, 1))
			expectSP(waitSQL)
			expectEffect(r.mock)
		}
		expectSP(dialect.MessageReleaseSQL)
		r.mock.ExpectCommit()
		got := runGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc { return ownEffect(t, k) },
			idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: true}), idempotent.WithLockTimeout(time.Second))
		if got["0a"].outcome != idempotent.Applied || got["1b"].outcome != idempotent.Applied {
			t.Fatalf("got %v, want both applied", got)
		}
		r.wantCalls(t, "BEGIN", first, lockSQL, claimSQL, waitSQL, effectSQL,
			next, lockSQL, claimSQL, waitSQL, effectSQL, dialect.MessageReleaseSQL, "COMMIT")
	})
	t.Run("bounds refused: over a minute; a positive bound on a dialect whose lock timeout outlives the transaction", func(t *testing.T) {
		r := newRecorded(t)
		if _, err := idempotent.New(r.db, pg, consumer, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Millisecond, LockWait: 2 * time.Minute})); err == nil || !strings.Contains(err.Error(), "LockWait") {
			t.Errorf("LockWait of 2m: error %v, want one naming LockWait", err)
		}
		my := resetDialect{pg}
		if _, err := idempotent.New(r.db, my, consumer, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Millisecond, LockWait: time.Second})); err == nil || !strings.Contains(err.Error(), "LockWait") {
			t.Errorf("LockWait on %s: error %v, want one naming LockWait", my.Name(), err)
		}
		if _, err := idempotent.New(r.db, my, consumer, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Millisecond})); err != nil {
			t.Errorf("the default LockWait on %s: %v, want no bound and no error", my.Name(), err)
		}
		if _, err := idempotent.New(r.db, my, consumer, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Millisecond, LockWait: -1})); err != nil {
			t.Errorf("no LockWait on %s: %v", my.Name(), err)
		}
	})
}

// companionSQL is the statement of the test companion of a delivery
// path's coalesced groups.
const companionSQL = "UPDATE positions SET n = n + 1"

// runPathGroup runs keys through a delivery path's Coalescer (groups of
// len(keys), at least 2) on r, concurrently; fn(key) is each delivery's
// handler, and the companion runs companionSQL once and fails, alone, the
// items in fail. It returns each delivery's result by key, whether each
// ran its alone body, and the items the companion was given, pass by pass.
func runPathGroup(t *testing.T, r *recorded, keys []string, fn func(key string) idempotent.TxFunc, fail map[string]error, ready func() int, opts ...idempotent.Option) (got map[string]coalesced, alone map[string]bool, passes [][]any) {
	t.Helper()
	opts = append([]idempotent.Option{idempotent.WithCoalescing(idempotent.Coalescing{Max: max(len(keys), 2), Wait: time.Second, LockWait: -1})}, opts...)
	mw := newMiddleware(t, r, opts...)
	p, ok := claimfold.NewPath(mw)
	if !ok {
		t.Fatal("no delivery path")
	}
	var mu sync.Mutex
	co, ok := p.Coalescer(func(ctx context.Context, tx *sql.Tx, items []any) ([]error, error) {
		mu.Lock()
		passes = append(passes, items)
		mu.Unlock()
		if _, err := tx.ExecContext(ctx, companionSQL); err != nil {
			return nil, err
		}
		var failed []error
		for i, it := range items {
			if err := fail[it.(string)]; err != nil {
				if failed == nil {
					failed = make([]error, len(items))
				}
				failed[i] = err
			}
		}
		return failed, nil
	}, ready)
	if !ok {
		t.Fatal("no Coalescer with WithCoalescing")
	}
	got, alone = map[string]coalesced{}, map[string]bool{}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := co.Process(context.Background(), k, time.Time{}, k, fn(k), func(ctx context.Context, a claimfold.Attempt) error {
				mu.Lock()
				alone[k] = true
				mu.Unlock()
				return nil
			})
			res := coalesced{err: err, outcome: idempotent.Duplicate}
			if applied {
				res.outcome = idempotent.Applied
			}
			if err != nil {
				res.outcome = 0
			}
			mu.Lock()
			got[k] = res
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got, alone, passes
}

func TestCoalescedPath(t *testing.T) {
	t.Run("without WithCoalescing there is no Coalescer", func(t *testing.T) {
		p, _ := claimfold.NewPath(newMiddleware(t, newRecorded(t)))
		if _, ok := p.Coalescer(func(context.Context, *sql.Tx, []any) ([]error, error) { return nil, nil }, nil); ok {
			t.Fatal("a Coalescer without WithCoalescing")
		}
	})
	t.Run("a group of duplicates still commits its companion", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 0)
		g.claim("b", 0)
		g.claim("c", 0)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 3))
		r.mock.ExpectCommit()
		got, alone, passes := runPathGroup(t, r, []string{"c", "a", "b"}, func(string) idempotent.TxFunc {
			return func(context.Context, *sql.Tx) error { t.Error("a duplicate's handler ran"); return nil }
		}, nil, nil)
		for k, res := range got {
			if res.outcome != idempotent.Duplicate || res.err != nil || alone[k] {
				t.Errorf("%s: %+v (alone %v), want a duplicate of the group", k, res, alone[k])
			}
		}
		if fmt.Sprint(passes) != "[[a b c]]" {
			t.Errorf("companion items %v, want [[a b c]] (key order)", passes)
		}
		r.wantCalls(t, "BEGIN", claimSQL, claimSQL, claimSQL, companionSQL, "COMMIT")
	})
	t.Run("a handler's failure: the group runs again without it, the companion without its item", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		r.mock.ExpectRollback()
		g = beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("c", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 2))
		r.mock.ExpectCommit()
		bad := errors.New("bad payload")
		got, _, passes := runPathGroup(t, r, []string{"a", "b", "c"}, func(k string) idempotent.TxFunc {
			if k == "b" {
				return func(context.Context, *sql.Tx) error { return bad }
			}
			return effect
		}, nil, nil)
		if got["a"].outcome != idempotent.Applied || got["c"].outcome != idempotent.Applied || !errors.Is(got["b"].err, bad) {
			t.Fatalf("got %v, want a and c applied, b its own error", got)
		}
		if fmt.Sprint(passes) != "[[a c]]" {
			t.Errorf("companion items %v, want [[a c]]", passes)
		}
		r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, "ROLLBACK",
			"BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, effectSQL, fenceCheckSQL, companionSQL, "COMMIT")
	})
	t.Run("with savepoints a failed member's item is left out of the companion", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		for _, k := range []string{"a", "b"} {
			r.mock.ExpectExec(dialect.MessageSavepointSQL).WillReturnResult(sqlmock.NewResult(0, 0))
			expectClaim(r.mock, k, 1)
			if k == "a" {
				r.mock.ExpectExec(dialect.MessageRollbackSQL).WillReturnResult(sqlmock.NewResult(0, 0))
				continue
			}
			expectEffect(r.mock)
			r.mock.ExpectExec(dialect.MessageReleaseSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		}
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 1))
		r.mock.ExpectCommit()
		bad := errors.New("bad payload")
		got, _, passes := runPathGroup(t, r, []string{"a", "b"}, func(k string) idempotent.TxFunc {
			if k == "a" {
				return func(context.Context, *sql.Tx) error { return bad }
			}
			return effect
		}, nil, nil, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: true, LockWait: -1}))
		if got["b"].outcome != idempotent.Applied || !errors.Is(got["a"].err, bad) {
			t.Fatalf("got %v, want b applied, a its own error", got)
		}
		if fmt.Sprint(passes) != "[[b]]" {
			t.Errorf("companion items %v, want [[b]]", passes)
		}
	})
	t.Run("a member the companion fails fails alone: the group runs again without it", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 1))
		r.mock.ExpectRollback()
		g = beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 1))
		r.mock.ExpectCommit()
		fenced := errors.New("fenced")
		got, _, passes := runPathGroup(t, r, []string{"a", "b"}, func(string) idempotent.TxFunc { return effect }, map[string]error{"b": fenced}, nil)
		if got["a"].outcome != idempotent.Applied || !errors.Is(got["b"].err, fenced) {
			t.Fatalf("got %v, want a applied, b the companion's error", got)
		}
		if fmt.Sprint(passes) != "[[a b] [a]]" {
			t.Errorf("companion items %v, want [[a b] [a]]", passes)
		}
	})
	t.Run("a delivery alone in its group runs its alone body", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin() // the alone body's own transaction: it writes nothing here
		r.mock.ExpectCommit()
		got, alone, passes := runPathGroup(t, r, []string{"a"}, func(string) idempotent.TxFunc { return effect }, nil, nil,
			idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Millisecond, LockWait: -1}))
		if !alone["a"] || len(passes) != 0 || got["a"].err != nil {
			t.Fatalf("got %v, alone %v, companion %v: want the alone body and no companion", got, alone, passes)
		}
		r.wantCalls(t, "BEGIN", "COMMIT")
	})
	t.Run("a group closes once it has as many members as ready says may join, not after Wait", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 2))
		r.mock.ExpectCommit()
		start := time.Now()
		got, _, passes := runPathGroup(t, r, []string{"a", "b"}, func(string) idempotent.TxFunc { return effect }, nil, func() int { return 2 },
			idempotent.WithCoalescing(idempotent.Coalescing{Max: 8, Wait: time.Second, LockWait: -1}))
		if d := time.Since(start); d >= time.Second {
			t.Errorf("the group of 2 closed after %v: it waited out Wait", d)
		}
		if got["a"].outcome != idempotent.Applied || got["b"].outcome != idempotent.Applied || fmt.Sprint(passes) != "[[a b]]" {
			t.Fatalf("got %v, companion %v: want a and b applied in one group", got, passes)
		}
	})
	t.Run("Flush closes a group that has every member ready says may still join", func(t *testing.T) {
		r := newRecorded(t)
		g := beginGroup(r.mock)
		g.claim("a", 1)
		expectEffect(r.mock)
		g.claim("b", 1)
		expectEffect(r.mock)
		g.check(nil)
		r.mock.ExpectExec(companionSQL).WillReturnResult(sqlmock.NewResult(0, 2))
		r.mock.ExpectCommit()
		mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 8, Wait: time.Second, LockWait: -1}))
		p, _ := claimfold.NewPath(mw)
		var ready, asked atomic.Int32
		ready.Store(3) // a third worker is still applying
		co, _ := p.Coalescer(func(ctx context.Context, tx *sql.Tx, items []any) ([]error, error) {
			_, err := tx.ExecContext(ctx, companionSQL)
			return nil, err
		}, func() int {
			asked.Add(1) // once per join, after the member joined
			return int(ready.Load())
		})
		start := time.Now()
		var wg sync.WaitGroup
		for _, k := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := co.Process(context.Background(), k, time.Time{}, k, effect, func(context.Context, claimfold.Attempt) error { return nil }); err != nil {
					t.Error(err)
				}
			}()
		}
		for deadline := time.Now().Add(10 * time.Second); asked.Load() < 2; runtime.Gosched() { // both have joined
			if time.Now().After(deadline) {
				t.Fatalf("ready was asked %d times in 10s, want once per join", asked.Load())
			}
		}
		ready.Store(2) // the third worker ran out of records
		co.Flush()
		wg.Wait()
		if d := time.Since(start); d >= time.Second {
			t.Errorf("the group closed after %v: Flush did not close it", d)
		}
	})
}

// TestCoalescingLockWaitOn: the bound a group sets per dialect, and
// Config reporting the Coalescing as given, LockWait included.
func TestCoalescingLockWaitOn(t *testing.T) {
	for _, tc := range []struct {
		d    dialect.Dialect
		in   time.Duration
		want time.Duration
		err  bool
	}{
		{pg, 0, idempotent.DefaultLockWait, false},
		{pg, 20 * time.Millisecond, 20 * time.Millisecond, false},
		{pg, -1, 0, false},
		{resetDialect{pg}, 0, 0, false},
		{resetDialect{pg}, -1, 0, false},
		{resetDialect{pg}, time.Second, 0, true},
	} {
		got, err := idempotent.Coalescing{Max: 2, Wait: time.Millisecond, LockWait: tc.in}.LockWaitOn(tc.d)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%T, LockWait %v: (%v, %v), want %v and error %v", tc.d, tc.in, got, err, tc.want, tc.err)
		}
	}
	r := newRecorded(t)
	c := idempotent.Coalescing{Max: 3, Wait: time.Millisecond, Savepoints: true, LockWait: -1}
	mw, err := idempotent.New(r.db, pg, consumer, idempotent.WithCoalescing(c))
	if err != nil || mw.Config().Coalescing != c {
		t.Fatalf("Config().Coalescing %+v (%v), want %+v", mw.Config().Coalescing, err, c)
	}
}

// TestCoalescingDuplicateLeaves: a duplicate whose caller leaves mid-group
// has nothing in the transaction: the group commits without running again.
func TestCoalescingDuplicateLeaves(t *testing.T) {
	r := newRecorded(t)
	g := beginGroup(r.mock)
	g.claim("a", 1)
	expectEffect(r.mock)
	g.claim("b", 0)
	r.mock.ExpectCommit()
	mw := newMiddleware(t, r, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, LockWait: -1}))
	bctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bDone := make(chan error, 1)
	go func() {
		_, err := mw.ProcessMessage(bctx, idempotent.Message{Key: "b"}, func(context.Context, *sql.Tx) error {
			t.Error("a duplicate's handler ran")
			return nil
		})
		bDone <- err
	}()
	aOut, aErr := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "a"}, func(ctx context.Context, tx *sql.Tx) error {
		cancel()
		if err := <-bDone; !errors.Is(err, context.Canceled) {
			t.Errorf("b got %v, want context.Canceled", err)
		}
		return effect(ctx, tx)
	})
	if aErr != nil || aOut != idempotent.Applied {
		t.Fatalf("a got (%v, %v), want applied", aOut, aErr)
	}
	r.wantCalls(t, "BEGIN", claimSQL, fenceSQL, effectSQL, fencedClaimSQL, "COMMIT")
}

// separateDialect is Postgres seen through dialect.Dialect alone: neither a
// dialect.TxFencer nor a dialect.StatementJoiner, as MySQL, MariaDB and
// SQLite are.
type separateDialect struct{ dialect.Dialect }

func TestCoalescingSavepointsOneStatementEachWithoutAJoiner(t *testing.T) {
	r := newRecorded(t)
	expectSP := func(q string) { r.mock.ExpectExec(q).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0)) }
	r.mock.ExpectBegin()
	for _, k := range []string{"a", "b"} {
		expectSP(dialect.MessageSavepointSQL)
		expectClaim(r.mock, k, 1)
		expectEffect(r.mock)
		expectSP(dialect.MessageReleaseSQL)
	}
	r.mock.ExpectCommit()
	mw, err := idempotent.New(r.db, separateDialect{pg}, consumer, noWait,
		idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, LockWait: -1}))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, k := range []string{"a", "b"} {
		go func() {
			ctx := context.WithValue(context.Background(), callerKey{}, k)
			out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, ownEffect(t, k))
			if err == nil && out != idempotent.Applied {
				err = fmt.Errorf("%s: outcome %v, want applied", k, out)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r.wantCalls(t, "BEGIN", dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageReleaseSQL,
		dialect.MessageSavepointSQL, claimSQL, effectSQL, dialect.MessageReleaseSQL, "COMMIT")
}
