package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// Queued effects (idempgx.Queue) on the real database. The coalescing
// suite runs on the queued path too (designs' "+queued" subtests); these
// are what only queued statements can do.

// violate queues, in tx, an insert into e's strict table that fails its
// CHECK constraint when sent (SQLSTATE 23514).
func (e *coEnv) violate(tx pgx.Tx, k string) error {
	return idempgx.Queue(tx, "INSERT INTO "+e.s+".strict (k, n) VALUES ($1, -1)", k)
}

// strict creates e's strict table: n must be positive.
func (e *coEnv) strict(t *testing.T) {
	t.Helper()
	exec(t, e.p, "CREATE TABLE "+e.s+".strict (k text NOT NULL, n int NOT NULL CHECK (n > 0))")
}

// TestQueuedStatementFailsAlone: a message whose queued statement fails
// (a constraint violation, found only when the statement is sent with the
// next message's claim, or with COMMIT for the last) fails alone with that
// error, nothing of it committed; the others commit. With savepoints
// nobody else runs again; optimistic, the messages before it do.
func TestQueuedStatementFailsAlone(t *testing.T) {
	t.Parallel()
	culprits(t, func(t *testing.T, savepoints bool, culprit int) {
		e := newCoEnv(t, 4)
		e.strict(t)
		keys := []string{"q1", "q2", "q3", "q4"}
		var runs runCounter
		res := callAll(e.mw(t, len(keys), savepoints), keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				runs.add(k)
				if err := e.apply(ctx, tx, k); err != nil || k != keys[culprit] {
					return err
				}
				return e.violate(tx, k)
			}
		})
		var applied, absent []string
		for i, r := range res {
			if i != culprit {
				if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Errorf("%s: %+v, want applied", keys[i], r)
				}
				applied = append(applied, keys[i])
				continue
			}
			absent = append(absent, keys[i])
			var pe *pgconn.PgError
			if !errors.As(r.Err, &pe) || pe.Code != "23514" || r.Outcome != 0 {
				t.Errorf("%s: %+v, want its queued statement's check violation", keys[i], r)
			}
		}
		want := map[string]int{"q1": 1, "q2": 1, "q3": 1, "q4": 1}
		if !savepoints {
			for _, k := range keys[:culprit] {
				want[k] = 2
			}
		}
		if got := runs.String(); got != fmt.Sprint(want) {
			t.Errorf("handler runs %s, want %v", got, want)
		}
		e.wantAudit(t, applied, absent)
		e.redeliver(t, e.mw(t, len(keys), savepoints), keys)
	})
}

// TestQueuedMixedInOrder: a handler that queues, reads, and queues again
// sees its queued statements' work in its immediate statement's result, and
// they all apply in the order it gave them — alone and in a group.
func TestQueuedMixedInOrder(t *testing.T) {
	t.Parallel()
	for _, coalesced := range []bool{false, true} {
		t.Run(fmt.Sprintf("coalesced=%v", coalesced), func(t *testing.T) {
			t.Parallel()
			designs(t, func(t *testing.T, savepoints bool) {
				e := newCoEnv(t, 4)
				exec(t, e.p, "CREATE TABLE "+e.s+".n (k text PRIMARY KEY, n int NOT NULL)")
				keys := []string{"o1", "o2", "o3"}
				m := e.mw(t, len(keys), savepoints)
				if !coalesced {
					m = e.plain(t)
				}
				res := callAll(m, keys, func(k string, r *coCall) idempgx.Func {
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := idempgx.Queue(tx, "INSERT INTO "+e.s+".n (k, n) VALUES ($1, 1)", k); err != nil {
							return err
						}
						var n int
						if err := tx.QueryRow(ctx, "UPDATE "+e.s+".n SET n = n * 10 WHERE k = $1 RETURNING n", k).Scan(&n); err != nil {
							return err
						}
						if n != 10 {
							return fmt.Errorf("the immediate update saw %d, want 10", n)
						}
						if err := idempgx.Queue(tx, "UPDATE "+e.s+".n SET n = n + 1 WHERE k = $1", k); err != nil {
							return err
						}
						return e.apply(ctx, tx, k)
					}
				})
				for i, r := range res {
					if r.Err != nil || r.Outcome != idempotent.Applied {
						t.Errorf("%s: %+v, want applied", keys[i], r)
					}
					if n := count(t, e.p, "SELECT n FROM "+e.s+".n WHERE k = $1", keys[i]); n != 11 {
						t.Errorf("%s: n = %d, want 11 (inserted 1, times 10, plus 1)", keys[i], n)
					}
				}
				e.wantAudit(t, keys, nil)
			})
		})
	}
}

// TestQueuedSingleFails: alone, a queued statement's failure, found with
// COMMIT, fails the message with its error; neither its claim nor its
// other effects commit, and a redelivery applies it.
func TestQueuedSingleFails(t *testing.T) {
	t.Parallel()
	e := newCoEnv(t, 2)
	e.queued = true
	e.strict(t)
	m := e.plain(t)
	ctx := context.Background()
	msg := idempotent.Message{Key: "s1"}
	o, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		if err := e.apply(ctx, tx, msg.Key); err != nil {
			return err
		}
		return e.violate(tx, msg.Key)
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || o != 0 {
		t.Fatalf("%v, %v: want the queued statement's check violation", o, err)
	}
	e.wantAudit(t, nil, []string{"s1"})
	if o, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, msg.Key) }); err != nil || o != idempotent.Applied {
		t.Fatalf("redelivered: %v, %v", o, err)
	}
	e.wantAudit(t, []string{"s1"}, nil)
}

// TestQueueRefuses: Queue refuses, with ErrNotQueueable and nothing
// queued, a transaction command, a savepoint's transaction, a transaction
// that is not a handler's, and a call after the handler returned.
func TestQueueRefuses(t *testing.T) {
	t.Parallel()
	e := newCoEnv(t, 2)
	m := e.plain(t)
	ctx := context.Background()
	var kept pgx.Tx
	o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "r1"}, func(ctx context.Context, tx pgx.Tx) error {
		kept = tx
		for _, sql := range []string{"COMMIT", " /* x */ rollback", "prepare transaction 'g'", "BEGIN"} {
			if err := idempgx.Queue(tx, sql); !errors.Is(err, idempgx.ErrNotQueueable) {
				return fmt.Errorf("Queue(%q) = %v, want ErrNotQueueable", sql, err)
			}
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := idempgx.Queue(sp, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
			return fmt.Errorf("Queue on a savepoint = %v, want ErrNotQueueable", err)
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		return e.apply(ctx, tx, "r1")
	})
	if err != nil || o != idempotent.Applied {
		t.Fatalf("%v, %v", o, err)
	}
	if err := idempgx.Queue(kept, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
		t.Errorf("Queue after the handler returned = %v, want ErrNotQueueable", err)
	}
	other, err := e.p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if err := idempgx.Queue(other, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
		t.Errorf("Queue on the pool's own transaction = %v, want ErrNotQueueable", err)
	}
	e.wantAudit(t, []string{"r1"}, nil)
}

// TestQueuedOnlyMistakes: on a Middleware made WithQueuedOnly (the
// optimistic design claims the whole group with BEGIN), whatever one
// handler does fails its own message alone — a queued statement that
// fails, an error, a panic, a statement run at once or a Conn() (refused,
// even when swallowed) — and every other message of the group commits
// with its effect; a key already claimed is a duplicate with no effect.
// Each case then redelivers every message: each effect exactly once.
func TestQueuedOnlyMistakes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		fn      func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error
		wantErr error // nil: a panic
		code    string
	}{
		{"queued statement fails", func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			return e.violate(tx, k)
		}, nil, "23514"},
		{"error", func(context.Context, *coEnv, pgx.Tx, string) error { return errBoom }, errBoom, ""},
		{"panic", func(context.Context, *coEnv, pgx.Tx, string) error { panic("boom") }, nil, ""},
		{"statement run at once, swallowed", func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			_, _ = tx.Exec(ctx, "COMMIT")
			return nil
		}, idempgx.ErrQueuedOnly, ""},
		{"Conn", func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			if c := tx.Conn(); c != nil {
				_, err := c.Exec(ctx, "COMMIT")
				return err
			}
			return nil
		}, idempgx.ErrQueuedOnly, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, culprit := range []int{0, 1, 3} {
				t.Run(fmt.Sprintf("message %d of 4", culprit+1), func(t *testing.T) {
					t.Parallel()
					queuedOnlyDesigns(t, func(t *testing.T, savepoints bool) {
						e := newCoEnv(t, 4)
						e.strict(t)
						keys := []string{"q1", "q2", "q3", "q4", "q5"}
						m := e.mw(t, len(keys), savepoints)
						// q5 is already claimed: a duplicate in the group.
						if o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "q5"}, func(ctx context.Context, tx pgx.Tx) error {
							return e.apply(ctx, tx, "q5")
						}); err != nil || o != idempotent.Applied {
							t.Fatalf("q5: %v, %v", o, err)
						}
						res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
							return func(ctx context.Context, tx pgx.Tx) error {
								if err := e.apply(ctx, tx, k); err != nil || k != keys[culprit] {
									return err
								}
								return tc.fn(ctx, e, tx, k)
							}
						})
						var applied []string
						for i, r := range res {
							k := keys[i]
							switch {
							case i == culprit && tc.code != "":
								var pe *pgconn.PgError
								if !errors.As(r.Err, &pe) || pe.Code != tc.code || r.Outcome != 0 {
									t.Errorf("%s: %+v, want SQLSTATE %s", k, r, tc.code)
								}
							case i == culprit && tc.wantErr == nil:
								if r.Panicked == nil {
									t.Errorf("%s: %+v, want its panic", k, r)
								}
							case i == culprit:
								if !errors.Is(r.Err, tc.wantErr) || r.Outcome != 0 {
									t.Errorf("%s: %+v, want an error matching %v", k, r, tc.wantErr)
								}
							case k == "q5":
								if r.Err != nil || r.Outcome != idempotent.Duplicate {
									t.Errorf("%s: %+v, want duplicate", k, r)
								}
							default:
								if r.Err != nil || r.Outcome != idempotent.Applied {
									t.Errorf("%s: %+v, want applied", k, r)
								}
								applied = append(applied, k)
							}
						}
						e.wantAudit(t, append(applied, "q5"), keys[culprit:culprit+1])
						e.redeliver(t, m, keys)
					})
				})
			}
		})
	}
}

// TestQueuedOnlyLostCommit: on a Middleware made WithQueuedOnly, a group
// whose COMMIT landed but whose answer was lost runs again and finds every
// claim: each message is a duplicate, applied once.
func TestQueuedOnlyLostCommit(t *testing.T) {
	t.Parallel()
	queuedOnlyDesigns(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		m := e.mw(t, 3, savepoints, idempgx.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
		keys := []string{"l1", "l2", "l3"}
		e.tap.armed.Store(true) // the first COMMIT's answer is cut
		res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, k) }
		})
		for i, r := range res {
			if r.Err != nil || r.Outcome != idempotent.Duplicate {
				t.Errorf("%s: %+v, want duplicate (the lost COMMIT landed)", keys[i], r)
			}
		}
		if n := e.tap.cut.Load(); n != 1 {
			t.Fatalf("%d commits cut, want 1", n)
		}
		e.wantAudit(t, keys, nil)
	})
}

// TestQueuedOnlyLeftBeforeItsTurn: on a Middleware made WithQueuedOnly,
// a message whose caller leaves while it waits for its turn — its claim
// already sent with BEGIN — fails alone with its context's error, nothing
// of it committed; the group runs again without it.
func TestQueuedOnlyLeftBeforeItsTurn(t *testing.T) {
	t.Parallel()
	queuedOnlyDesigns(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		m := e.mw(t, 2, savepoints)
		bctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		aHeld, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		aErr, bErr := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				once.Do(func() { close(aHeld); <-release })
				return e.apply(ctx, tx, "a")
			})
			aErr <- err
		}()
		go func() {
			_, err := m.ProcessMessage(bctx, idempotent.Message{Key: "b"}, func(ctx context.Context, tx pgx.Tx) error {
				return e.apply(ctx, tx, "b")
			})
			bErr <- err
		}()
		<-aHeld // a's handler runs: b waits for its turn
		cancel()
		if err := <-bErr; !errors.Is(err, context.Canceled) {
			t.Fatalf("b got %v, want context.Canceled", err)
		}
		close(release)
		if err := <-aErr; err != nil {
			t.Fatalf("a got %v", err)
		}
		e.wantAudit(t, []string{"a"}, []string{"b"})
	})
}

// TestQueuedOnlyHotRow: on a Middleware made WithQueuedOnly, a message
// whose queued statement waits for a row lock past the group's LockWait
// (found with COMMIT) leaves the group and runs alone, unbounded; the
// others commit while the row is still locked.
func TestQueuedOnlyHotRow(t *testing.T) {
	t.Parallel()
	queuedOnlyDesigns(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		ctx := context.Background()
		rows := e.rows(t, 1)
		m := e.mwWith(t, idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: savepoints, LockWait: 50 * time.Millisecond})
		holder := e.hold(t, "SELECT n FROM "+rows+" WHERE id = 1 FOR UPDATE")
		hot, cold := make(chan coCall, 1), make(chan coCall, 1)
		for k, ch := range map[string]chan coCall{"hot": hot, "cold": cold} {
			go func() {
				var r coCall
				r.Outcome, r.Err = m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error {
					if k == "hot" {
						if err := idempgx.Queue(tx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 1"); err != nil {
							return err
						}
					}
					return e.apply(ctx, tx, k)
				})
				ch <- r
			}()
		}
		select {
		case c := <-cold:
			if c.Err != nil || c.Outcome != idempotent.Applied {
				t.Fatalf("cold: %+v, want applied", c)
			}
		case r := <-hot:
			t.Fatalf("hot finished first, while its row was locked: %+v", r)
		case <-time.After(30 * time.Second):
			t.Fatal("cold did not commit while the hot row was locked")
		}
		e.wantAudit(t, []string{"cold"}, []string{"hot"})
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if r := <-hot; r.Err != nil || r.Outcome != idempotent.Applied {
			t.Fatalf("hot: %+v, want applied", r)
		}
		e.wantAudit(t, []string{"cold", "hot"}, nil)
		if n := count(t, e.p, "SELECT n FROM "+rows+" WHERE id = 1"); n != 1 {
			t.Errorf("the hot row's n = %d, want 1", n)
		}
	})
}

// TestQueuedOnlyOneTripFallsBack: on a Middleware made WithQueuedOnly, a
// group sent in one round trip (its handlers run first, then BEGIN, the
// claims, the effects and COMMIT) that meets a duplicate, or a queued
// statement that fails, applies nothing there and goes on in two round
// trips with the statements its handlers queued: the duplicate comes back
// Duplicate with no effect, the failed statement's message fails alone, the
// others are applied once. A duplicate alone makes no handler run again;
// a failed message, in the optimistic design, makes the group run again
// without it.
func TestQueuedOnlyOneTripFallsBack(t *testing.T) {
	t.Parallel()
	queuedOnlyDesigns(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		e.strict(t)
		m := e.mw(t, 4, savepoints)
		first := callAll(m, []string{"d1", "d2"}, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, k) }
		})
		for _, r := range first {
			if r.Err != nil || r.Outcome != idempotent.Applied {
				t.Fatalf("first delivery: %+v", first)
			}
		}
		// v's statement fails; d1 and d2 are duplicates.
		for _, keys := range [][]string{{"a", "b", "d1", "c"}, {"e", "d2", "v", "z"}} {
			var runs runCounter
			res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
				return func(ctx context.Context, tx pgx.Tx) error {
					runs.add(k)
					if err := e.apply(ctx, tx, k); err != nil || k != "v" {
						return err
					}
					return e.violate(tx, k)
				}
			})
			failed := false
			for i, r := range res {
				var pe *pgconn.PgError
				switch k := keys[i]; {
				case k[0] == 'd' && (r.Err != nil || r.Outcome != idempotent.Duplicate):
					t.Errorf("%s: %+v, want duplicate", k, r)
				case k == "v":
					failed = true
					if !errors.As(r.Err, &pe) || pe.Code != "23514" || r.Outcome != 0 {
						t.Errorf("%s: %+v, want its queued statement's check violation", k, r)
					}
				case k[0] != 'd' && (r.Err != nil || r.Outcome != idempotent.Applied):
					t.Errorf("%s: %+v, want applied", k, r)
				}
			}
			most := 1
			if failed && !savepoints {
				most = 2
			}
			runs.mu.Lock()
			for _, k := range keys {
				if n := runs.n[k]; n > most || n == 0 && k[0] != 'd' {
					t.Errorf("%v: handler of %s ran %d times, want 1 to %d (0 for a duplicate)", keys, k, n, most)
				}
			}
			runs.mu.Unlock()
		}
		e.wantAudit(t, []string{"a", "b", "c", "d1", "d2", "e", "z"}, []string{"v"})
		if n := count(t, e.p, "SELECT count(*) FROM "+e.s+".strict"); n != 0 {
			t.Errorf("%d rows in the strict table, want none", n)
		}
	})
}

// TestQueuedOnlySingleOneTrip: alone, on a Middleware made WithQueuedOnly,
// a new message costs one round trip (its handler runs first; BEGIN, the
// claim, its statements and COMMIT go together); a duplicate comes back
// Duplicate with no effect, a failed queued statement fails its message
// with nothing applied, and a handler's error is returned, nothing
// applied — each after the handler ran once.
func TestQueuedOnlySingleOneTrip(t *testing.T) {
	t.Parallel()
	e := newCoEnv(t, 1)
	e.queued = true
	e.strict(t)
	m := e.plain(t, idempgx.WithQueuedOnly())
	ctx := context.Background()
	var runs runCounter
	call := func(k string, fail error) (idempotent.Outcome, error) {
		return m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error {
			runs.add(k)
			if err := e.apply(ctx, tx, k); err != nil || fail != nil {
				return errors.Join(err, fail)
			}
			if k == "v" {
				return e.violate(tx, k)
			}
			return nil
		})
	}
	if o, err := call("warm", nil); err != nil || o != idempotent.Applied {
		t.Fatalf("warm: %v, %v", o, err)
	}
	before := e.tap.writes.Load()
	if o, err := call("a", nil); err != nil || o != idempotent.Applied {
		t.Fatalf("a: %v, %v, want applied", o, err)
	}
	if n := e.tap.writes.Load() - before; n != 1 {
		t.Errorf("a new message: %d round trips, want 1", n)
	}
	if o, err := call("a", nil); err != nil || o != idempotent.Duplicate {
		t.Errorf("a again: %v, %v, want duplicate", o, err)
	}
	var pe *pgconn.PgError
	if o, err := call("v", nil); !errors.As(err, &pe) || pe.Code != "23514" || o != 0 {
		t.Errorf("v: %v, %v, want its queued statement's check violation", o, err)
	}
	if o, err := call("f", errBoom); !errors.Is(err, errBoom) || o != 0 {
		t.Errorf("f: %v, %v, want its handler's error", o, err)
	}
	if o, err := call("f", nil); err != nil || o != idempotent.Applied {
		t.Errorf("f redelivered: %v, %v, want applied", o, err)
	}
	runs.mu.Lock()
	if want := map[string]int{"warm": 1, "a": 2, "v": 1, "f": 3}; fmt.Sprint(runs.n) != fmt.Sprint(want) {
		t.Errorf("handler runs %v, want %v", runs.n, want)
	}
	runs.mu.Unlock()
	e.wantAudit(t, []string{"warm", "a", "f"}, []string{"v"})
}
