package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// A handler's mistakes in a coalesced group, on the real database, in both
// designs: whatever one handler does to the group's transaction fails its
// own message alone, and leaves every other message of the group either
// committed with its effect or not claimed at all. Each case then
// redelivers every message with a correct handler: each effect is then
// applied exactly once.

// mistake is what the culprit's handler does, and what it must cost.
type mistake struct {
	name string
	// fn is the culprit's handler.
	fn func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error
	// wantErr is the culprit's error (all of them must match); nil: it is
	// applied. panics: it panics instead.
	wantErr []error
	panics  bool
	// effects and claims are the culprit's after the group.
	effects, claims int
	// before is the outcome of the messages before the culprit: Applied,
	// or Duplicate when the culprit's own COMMIT committed them.
	before idempotent.Outcome
}

// execThenApply is a handler that applies its effect and then runs sql
// through tx, returning ret.
func execThenApply(sql string, ret error) func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
	return func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
		return ret
	}
}

// onConn is execThenApply through tx.Conn().
func onConn(sql string) func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
	return func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		_, err := tx.Conn().Exec(ctx, sql)
		return err
	}
}

var mistakes = []mistake{
	{name: "tx.Commit", fn: func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		_ = tx.Commit(ctx) // refused; swallowed
		return nil
	}, wantErr: []error{idempotent.ErrAutocommit}, before: idempotent.Applied},
	{name: "tx.Rollback", fn: func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	}, wantErr: []error{idempotent.ErrAutocommit}, before: idempotent.Applied},
	{name: "COMMIT", fn: execThenApply("COMMIT", nil), wantErr: []error{idempotent.ErrAutocommit}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "END", fn: execThenApply("END", nil), wantErr: []error{idempotent.ErrAutocommit}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "ROLLBACK", fn: execThenApply("ROLLBACK", nil), wantErr: []error{idempotent.ErrAutocommit}, before: idempotent.Applied},
	// Statements without arguments go as one simple-protocol query: the
	// transaction is another one when the handler returns.
	{name: "COMMIT; BEGIN", fn: execThenApply("COMMIT; BEGIN", nil), wantErr: []error{idempotent.ErrAutocommit}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "ROLLBACK; BEGIN", fn: execThenApply("ROLLBACK; BEGIN", nil), wantErr: []error{idempotent.ErrAutocommit}, before: idempotent.Applied},
	{name: "COMMIT; BEGIN, then its own error", fn: execThenApply("COMMIT; BEGIN", errBoom), wantErr: []error{idempotent.ErrAutocommit, errBoom}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "COMMIT on tx.Conn()", fn: onConn("COMMIT"), wantErr: []error{idempotent.ErrAutocommit}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "COMMIT; BEGIN on tx.Conn()", fn: onConn("COMMIT; BEGIN"), wantErr: []error{idempotent.ErrAutocommit}, effects: 1, claims: 1, before: idempotent.Duplicate},
	{name: "swallowed error", fn: func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return nil
	}, wantErr: []error{pgx.ErrTxCommitRollback}, before: idempotent.Applied},
	{name: "panic", fn: func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
		if err := e.apply(ctx, tx, k); err != nil {
			return err
		}
		panic("boom")
	}, panics: true, before: idempotent.Applied},
	// Its effect commits on its own, outside the group: its own mistake,
	// which costs no other message anything.
	{name: "write through the pool", fn: func(ctx context.Context, e *coEnv, _ pgx.Tx, k string) error {
		_, err := e.p.Exec(ctx, "INSERT INTO "+e.audit+" (k) VALUES ($1)", k)
		return err
	}, effects: 1, claims: 1, before: idempotent.Applied},
}

// TestCoalescedHandlerMistakes runs each mistake by the first of four
// messages (whose claim went with BEGIN), by the second and by the last, in
// both designs.
func TestCoalescedHandlerMistakes(t *testing.T) {
	t.Parallel()
	for _, mk := range mistakes {
		for _, culprit := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("%s/message %d of 4", mk.name, culprit+1), func(t *testing.T) {
				t.Parallel()
				designs(t, func(t *testing.T, savepoints bool) {
					testHandlerMistake(t, savepoints, mk, culprit)
				})
			})
		}
	}
}

func testHandlerMistake(t *testing.T, savepoints bool, mk mistake, culprit int) {
	e := newCoEnv(t, 4)
	keys := []string{"m1", "m2", "m3", "m4"}
	m := e.mw(t, len(keys), savepoints)
	var mistaken bool // the culprit's first run makes the mistake
	res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
		return func(ctx context.Context, tx pgx.Tx) error {
			if k == keys[culprit] && !mistaken {
				mistaken = true // handlers run one at a time
				return mk.fn(ctx, e, tx, k)
			}
			return e.apply(ctx, tx, k)
		}
	})
	for i, r := range res {
		k := keys[i]
		effects, claims := e.counts(t, k)
		switch {
		case i == culprit:
			switch {
			case mk.panics:
				if r.Panicked == nil {
					t.Errorf("%s: %+v, want its panic", k, r)
				}
			case mk.wantErr == nil && (r.Err != nil || r.Outcome != idempotent.Applied):
				t.Errorf("%s: %+v, want applied", k, r)
			}
			for _, want := range mk.wantErr {
				if !errors.Is(r.Err, want) || r.Outcome != 0 {
					t.Errorf("%s: %+v, want an error matching %v", k, r, want)
				}
			}
			if effects != mk.effects || claims != mk.claims {
				t.Errorf("%s: %d effects and %d claims, want %d and %d", k, effects, claims, mk.effects, mk.claims)
			}
			continue
		case i < culprit:
			if r.Err != nil || r.Outcome != mk.before {
				t.Errorf("%s, before the culprit: %+v, want %v", k, r, mk.before)
			}
		default:
			if r.Err != nil || r.Outcome != idempotent.Applied {
				t.Errorf("%s, after the culprit: %+v, want applied", k, r)
			}
		}
		if effects != 1 || claims != 1 {
			t.Errorf("%s: %d effects and %d claims, want 1 and 1", k, effects, claims)
		}
	}
	e.redeliver(t, m, keys)
}

// redeliver delivers every key of keys again, at once, with a correct
// handler, and fails the test unless each then has exactly one effect and
// one claim.
func (e *coEnv) redeliver(t *testing.T, m *idempgx.Middleware, keys []string) {
	t.Helper()
	res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
		return func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, k) }
	})
	for i, r := range res {
		if r.Err != nil || r.Panicked != nil {
			t.Errorf("%s redelivered: %+v", keys[i], r)
		}
	}
	e.wantAudit(t, keys, nil)
}

// hold begins a transaction on e's pool and runs stmts in it; it is rolled
// back at the test's end if it is still open.
func (e *coEnv) hold(t *testing.T, stmts ...string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return tx
}

// rows creates a table of rows (id, n) with ids 1 to ids, n at 0, and
// returns its name.
func (e *coEnv) rows(t *testing.T, ids int) string {
	t.Helper()
	rows := e.s + ".rows"
	exec(t, e.p, "CREATE TABLE "+rows+" (id int PRIMARY KEY, n int NOT NULL)")
	exec(t, e.p, "INSERT INTO "+rows+" SELECT id, 0 FROM generate_series(1, $1::int) id", ids)
	return rows
}

// counts returns k's effects and claims.
func (e *coEnv) counts(t *testing.T, k string) (effects, claims int) {
	t.Helper()
	return count(t, e.p, "SELECT count(*) FROM "+e.audit+" WHERE k = $1", k),
		count(t, e.p, "SELECT count(*) FROM "+e.s+".claims WHERE consumer = 'co' AND message_key = $1", k)
}

// TestCoalescedDeadlockVictim: the second of three handlers takes a row
// lock, then waits for a row another transaction holds, which then waits
// for the first: the handler's statement is the deadlock's victim (its wait
// began first, and the other transaction's deadlock_timeout is longer).
// When the handler returns the error, the group's transaction failed and
// the whole group runs again (every message applied once); when it
// swallows it, its own message fails, and the others commit.
func TestCoalescedDeadlockVictim(t *testing.T) {
	t.Parallel()
	for _, swallow := range []bool{false, true} {
		t.Run(fmt.Sprintf("swallowed=%v", swallow), func(t *testing.T) {
			t.Parallel()
			designs(t, func(t *testing.T, savepoints bool) {
				testDeadlockVictim(t, savepoints, swallow)
			})
		})
	}
}

func testDeadlockVictim(t *testing.T, savepoints, swallow bool) {
	e := newCoEnv(t, 4)
	ctx := context.Background()
	rows := e.rows(t, 2)
	m := e.mwWith(t, idempotent.Coalescing{Max: 3, Wait: time.Second, Savepoints: savepoints, LockWait: -1})
	other := e.hold(t, "SET LOCAL deadlock_timeout = '10min'", "UPDATE "+rows+" SET n = n + 1 WHERE id = 2")
	keys := []string{"d1", "d2", "d3"}
	var victim error
	runs := 0
	pid := make(chan uint32, 1)
	called := make(chan []coCall, 1)
	go func() {
		called <- callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := e.apply(ctx, tx, k); err != nil || k != "d2" {
					return err
				}
				if runs++; runs > 1 {
					return nil
				}
				if _, err := tx.Exec(ctx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 1"); err != nil {
					return err
				}
				pid <- tx.Conn().PgConn().PID()
				_, victim = tx.Exec(ctx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 2")
				if swallow {
					return nil
				}
				return victim
			}
		})
	}()
	p := <-pid
	waitFor(t, "the handler to wait for row 2", func() bool {
		return count(t, e.p, "SELECT cardinality(pg_blocking_pids($1))", int32(p)) > 0
	})
	// Returns once the handler's statement, the victim, failed.
	if _, err := other.Exec(ctx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatalf("the other transaction: %v, want its update done once the handler's transaction failed", err)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-called
	if code := sqlState(victim); code != "40P01" {
		t.Fatalf("the handler's statement: %v, want a deadlock (40P01)", victim)
	}
	for i, r := range res {
		k := keys[i]
		effects, claims := e.counts(t, k)
		if k == "d2" && swallow {
			if !errors.Is(r.Err, pgx.ErrTxCommitRollback) || effects != 0 || claims != 0 {
				t.Errorf("%s: %+v, %d effects and %d claims; want its own failure, none and none", k, r, effects, claims)
			}
			continue
		}
		if r.Err != nil || r.Outcome != idempotent.Applied || effects != 1 || claims != 1 {
			t.Errorf("%s: %+v, %d effects and %d claims; want applied, 1 and 1", k, r, effects, claims)
		}
	}
	e.redeliver(t, m, keys)
}

// sqlState returns err's SQLSTATE, or "".
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// TestCoalescedHandlerCancelled: the second of three handlers hangs (it
// waits for a row lock held elsewhere) until its caller's context ends,
// which closes the group's connection: that message fails with its
// context's error, and the others are applied in the group's next
// transaction, on another connection, once the server has ended the first
// (when the lock is released, its backend finds its client gone).
func TestCoalescedHandlerCancelled(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		ctx := context.Background()
		rows := e.rows(t, 1)
		m := e.mwWith(t, idempotent.Coalescing{Max: 3, Wait: time.Second, Savepoints: savepoints, LockWait: -1})
		holder := e.hold(t, "SELECT FROM "+rows+" WHERE id = 1 FOR UPDATE")
		hctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pid := make(chan uint32, 1)
		keys := []string{"h1", "h2", "h3"}
		res := make([]coCall, len(keys))
		done := make(chan int, len(keys))
		for i, k := range keys {
			cctx := ctx
			if k == "h2" {
				cctx = hctx
			}
			go func() {
				defer func() { done <- i }()
				res[i].Outcome, res[i].Err = m.ProcessMessage(cctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error {
					if err := e.apply(ctx, tx, k); err != nil || k != "h2" {
						return err
					}
					pid <- tx.Conn().PgConn().PID()
					_, err := tx.Exec(ctx, "SELECT FROM "+rows+" WHERE id = 1 FOR UPDATE")
					return err
				})
			}()
		}
		p := <-pid
		waitFor(t, "the handler to wait for the row", func() bool {
			return count(t, e.p, "SELECT cardinality(pg_blocking_pids($1))", int32(p)) > 0
		})
		cancel()
		if i := <-done; i != 1 || !errors.Is(res[1].Err, context.Canceled) {
			t.Fatalf("call %d returned first; h2: %+v, want context.Canceled", i, res[1])
		}
		// The server ends the first transaction once the lock is released.
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		<-done
		<-done
		for i, r := range res {
			if i != 1 && (r.Err != nil || r.Outcome != idempotent.Applied) {
				t.Errorf("%s: %+v, want applied", keys[i], r)
			}
		}
		e.wantAudit(t, []string{"h1", "h3"}, []string{"h2"})
		e.redeliver(t, m, keys)
	})
}

// TestCoalescedCommitFails: the second of three handlers breaks a deferred
// constraint, so the group's COMMIT fails, for good, with no one to blame:
// every message then runs alone, to its own outcome — that one fails, the
// others are applied.
func TestCoalescedCommitFails(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		uniq := e.s + ".uniq"
		exec(t, e.p, "CREATE TABLE "+uniq+" (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
		exec(t, e.p, "INSERT INTO "+uniq+" VALUES (1)")
		keys := []string{"c1", "c2", "c3"}
		m := e.mw(t, len(keys), savepoints)
		res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := e.apply(ctx, tx, k); err != nil || k != "c2" {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+uniq+" VALUES (1)")
				return err
			}
		})
		for i, r := range res {
			if i == 1 {
				if sqlState(r.Err) != "23505" {
					t.Errorf("c2: %+v, want its own unique violation at COMMIT", r)
				}
			} else if r.Err != nil || r.Outcome != idempotent.Applied {
				t.Errorf("%s: %+v, want applied", keys[i], r)
			}
		}
		e.wantAudit(t, []string{"c1", "c3"}, []string{"c2"})
	})
}

// leaveRowsOpen applies k's effect, then leaves a query's rows open
// (queryLeftOpen).
func leaveRowsOpen(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
	if err := e.apply(ctx, tx, k); err != nil {
		return err
	}
	return queryLeftOpen(ctx, tx)
}

// queryLeftOpen runs a query on tx and reads one of its rows, leaving them
// open (no rows.Close), so that the connection is busy with them.
func queryLeftOpen(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, "SELECT generate_series(1, 3)")
	if err != nil {
		return err
	}
	rows.Next()
	return nil
}

// TestCoalescedHandlerLeavesRowsOpen: a handler that returns with a
// query's rows open, every time it runs, leaves the group's connection
// busy: its own message fails at once (not as a lost connection, retried
// until the policy gives up, nor as a handler that ended the transaction),
// and every other message of the group is applied.
func TestCoalescedHandlerLeavesRowsOpen(t *testing.T) {
	t.Parallel()
	culprits(t, func(t *testing.T, savepoints bool, culprit int) {
		e := newCoEnv(t, 4)
		keys := []string{"m1", "m2", "m3", "m4"}
		m := e.mw(t, len(keys), savepoints, idempgx.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
		runs := 0 // the culprit's; handlers run one at a time
		res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if k != keys[culprit] {
					return e.apply(ctx, tx, k)
				}
				runs++
				return leaveRowsOpen(ctx, e, tx, k)
			}
		})
		for i, r := range res {
			k := keys[i]
			if i != culprit {
				if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Errorf("%s: %+v, want applied", k, r)
				}
				continue
			}
			var exhausted *idempotent.RetriesExhaustedError
			if r.Err == nil || errors.Is(r.Err, idempotent.ErrAutocommit) || errors.As(r.Err, &exhausted) || runs != 1 {
				t.Errorf("%s: %+v after %d runs, want its own failure after one", k, r, runs)
			}
		}
		others := slices.Delete(slices.Clone(keys), culprit, culprit+1)
		e.wantAudit(t, others, keys[culprit:culprit+1])
		e.redeliver(t, m, keys)
	})
}

// culprits runs test, in parallel, with the culprit at message 1, 2 and 4
// of 4, in each design (designs).
func culprits(t *testing.T, test func(t *testing.T, savepoints bool, culprit int)) {
	for _, culprit := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("message %d of 4", culprit+1), func(t *testing.T) {
			t.Parallel()
			designs(t, func(t *testing.T, savepoints bool) { test(t, savepoints, culprit) })
		})
	}
}
