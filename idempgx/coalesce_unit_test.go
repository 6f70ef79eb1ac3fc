package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// coResult is one coalesced call's result.
type coResult struct {
	outcome idempotent.Outcome
	err     error
}

// scriptedGroup calls ProcessMessage once per key at the same time on a
// scripted Middleware whose groups close at len(keys) members, with
// fn(i) as the i-th call's handler, and returns the results in the order of
// keys. c gives the design and the lock wait bound.
func scriptedGroup(t *testing.T, s *script, c idempotent.Coalescing, keys []string, fn func(i int) Func) []coResult {
	t.Helper()
	s.soft = true
	c.Max, c.Wait = len(keys), time.Second
	m := scripted(t, s, WithCoalescing(c))
	res := make([]coResult, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].outcome, res[i].err = m.ProcessMessage(context.Background(), idempotent.Message{Key: k}, fn(i))
		}()
	}
	wg.Wait()
	s.done()
	return res
}

// TestCoalescedSequence: the statements of a coalesced group. BEGIN and the
// group's claims go in one batch; with savepoints, each new message's
// SAVEPOINT (after the RELEASE of the previous one's) goes in the batch of
// its handler's first statement, and a failed message's rollback to it,
// its release and the deletion of its claim in one batch of their own.
func TestCoalescedSequence(t *testing.T) {
	claim := func(keys []string, rows ...string) step {
		return step{sql: []string{"begin", batchSQL}, tags: []string{"BEGIN"}, args: []any{"orders", keys}, rows: rows, status: 'T'}
	}
	runs := func(before ...string) step {
		tags := []string{}
		for _, s := range before {
			tags = append(tags, s[:len("SAVEPOINT")]) // a tag's text is not checked
		}
		return step{sql: append(before, effect), tags: append(tags, "UPDATE 1"), status: 'T'}
	}
	commit := step{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'}
	rollback := step{sql: []string{"rollback"}, tags: []string{"ROLLBACK"}, status: 'I'}
	const deleteSQL = `DELETE FROM "processed_messages" WHERE consumer = $1 AND message_key = $2`
	// undo is a failed member's rollback to its savepoint, its release and,
	// for key, the deletion of its claim, after the unsent statements
	// before: one query of the simple protocol.
	undo := func(key string, before ...string) step {
		sql := append(before, dialect.MessageRollbackSQL, dialect.MessageReleaseSQL)
		args := []any{pgx.QueryExecModeSimpleProtocol}
		if key != "" {
			sql, args = append(sql, deleteSQL), append(args, "orders", key)
		}
		return step{sql: []string{strings.Join(sql, "; ")}, tags: []string{"DELETE 1"}, args: args, status: 'T'}
	}
	sp, rel := dialect.MessageSavepointSQL, dialect.MessageReleaseSQL
	lw := "SET LOCAL lock_timeout = 50" // Coalescing.LockWait's default
	effectThen := func(err error) Func {
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, xerr := tx.Exec(ctx, effect); xerr != nil {
				return xerr
			}
			return err
		}
	}
	ok := func(int) Func { return effectThen(nil) }
	const (
		a = idempotent.Applied
		d = idempotent.Duplicate
	)
	for _, tc := range []struct {
		name       string
		savepoints bool
		bounded    bool // Coalescing.LockWait's default bound; else none
		keys       []string
		fn         func(i int) Func
		steps      []step
		want       []idempotent.Outcome
		wantErr    []error   // by call, when not nil
		other      *coResult // with want nil: one call applied, the other this
	}{
		{name: "optimistic: begin and the claims in one batch, each handler, one commit",
			keys: []string{"b", "a", "c"}, fn: ok,
			steps: []step{claim([]string{"a", "b", "c"}, "a", "c"), runs(), runs(), commit},
			want:  []idempotent.Outcome{d, a, a}},
		{name: "optimistic: a failed handler rolls the group back; it runs again without it",
			keys: []string{"a", "b"}, fn: func(i int) Func { return effectThen([]error{nil, errBoom}[i]) },
			steps:   []step{claim([]string{"a", "b"}, "a", "b"), runs(), runs(), rollback, claim([]string{"a"}, "a"), runs(), commit},
			want:    []idempotent.Outcome{a, 0},
			wantErr: []error{nil, errBoom}},
		{name: "savepoints: each savepoint rides with its handler's first statement",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: ok,
			steps: []step{claim([]string{"a", "b", "c"}, "a", "b", "c"), runs(sp), runs(rel, sp), runs(rel, sp), commit},
			want:  []idempotent.Outcome{a, a, a}},
		{name: "savepoints: duplicates take none",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: ok,
			steps: []step{claim([]string{"a", "b", "c"}, "b"), runs(sp), commit},
			want:  []idempotent.Outcome{d, a, d}},
		{name: "optimistic: the lock wait bound rides with the first handler's first statement",
			bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim([]string{"a", "b"}, "a", "b"), runs(lw), runs(), commit},
			want:  []idempotent.Outcome{a, a}},
		{name: "savepoints: the lock wait bound rides before the first savepoint",
			savepoints: true, bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim([]string{"a", "b"}, "a", "b"), runs(lw, sp), runs(rel, sp), commit},
			want:  []idempotent.Outcome{a, a}},
		{name: "savepoints: a handler past the lock wait bound leaves the group and runs alone",
			savepoints: true, bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim([]string{"a", "b"}, "a", "b"), {sql: []string{lw, sp, effect}, tags: []string{"SET", "SAVEPOINT"}, err: errLockTimeout, status: 'E'},
				undo("a"), runs(sp), commit,
				{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, args: []any{"orders", "a"}, status: 'T'}, runs(), commit},
			want: []idempotent.Outcome{a, a}},
		{name: "savepoints: a key given twice is applied once",
			savepoints: true, keys: []string{"a", "a"}, fn: ok,
			steps: []step{claim([]string{"a"}, "a"), runs(sp), commit}, other: &coResult{outcome: d}},
		{name: "savepoints: a handler that sends nothing leaves its savepoint to the next",
			savepoints: true, keys: []string{"a", "b"},
			fn: func(i int) Func {
				if i == 0 {
					return func(context.Context, pgx.Tx) error { return nil }
				}
				return effectThen(nil)
			},
			steps: []step{claim([]string{"a", "b"}, "a", "b"), runs(sp), commit},
			want:  []idempotent.Outcome{a, a}},
		{name: "savepoints: a failed handler is undone alone, its claim deleted; the others run once",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: func(i int) Func { return effectThen([]error{nil, errBoom, nil}[i]) },
			steps:   []step{claim([]string{"a", "b", "c"}, "a", "b", "c"), runs(sp), runs(rel, sp), undo("b"), runs(sp), commit},
			want:    []idempotent.Outcome{a, 0, a},
			wantErr: []error{nil, errBoom, nil}},
		{name: "savepoints: a handler that fails before any statement: its savepoint is never sent, its claim deleted",
			savepoints: true, keys: []string{"a", "b", "c"},
			fn: func(i int) Func {
				if i == 1 {
					return func(context.Context, pgx.Tx) error { return errBoom }
				}
				return effectThen(nil)
			},
			steps: []step{claim([]string{"a", "b", "c"}, "a", "b", "c"), runs(sp),
				{sql: []string{rel + "; " + deleteSQL}, tags: []string{"DELETE 1"}, args: []any{pgx.QueryExecModeSimpleProtocol, "orders", "b"}, status: 'T'}, runs(sp), commit},
			want:    []idempotent.Outcome{a, 0, a},
			wantErr: []error{nil, errBoom, nil}},
		{name: "savepoints: a failed handler of a key given twice leaves the claim to the other",
			savepoints: true, keys: []string{"k", "k"},
			fn: func() func(int) Func {
				var runs atomic.Int32
				return func(int) Func {
					return func(ctx context.Context, tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, effect); err != nil {
							return err
						}
						if runs.Add(1) == 1 {
							return errBoom
						}
						return nil
					}
				}
			}(),
			steps: []step{claim([]string{"k"}, "k"), runs(sp), undo(""), runs(sp), commit}, other: &coResult{err: errBoom}},
		{name: "savepoints: every new message failed: rolled back, not committed",
			savepoints: true, keys: []string{"a", "b"}, fn: func(i int) Func { return effectThen([]error{errBoom, nil}[i]) },
			steps:   []step{claim([]string{"a", "b"}, "a"), runs(sp), undo("a"), rollback},
			want:    []idempotent.Outcome{0, d},
			wantErr: []error{errBoom, nil}},
		{name: "savepoints: a serialization failure of the group's transaction retries the group",
			savepoints: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim([]string{"a", "b"}, "a", "b"), runs(sp), {sql: []string{rel, sp, effect}, tags: []string{"RELEASE", "SAVEPOINT"}, err: errSerialization, status: 'E'}, rollback,
				claim([]string{"a", "b"}, "a", "b"), runs(sp), runs(rel, sp), commit},
			want: []idempotent.Outcome{a, a}},
		{name: "savepoints: a failed savepoint is the group's",
			savepoints: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim([]string{"a", "b"}, "a", "b"), runs(sp), {sql: []string{rel, sp, effect}, err: errSerialization, status: 'E'}, rollback,
				claim([]string{"a", "b"}, "a", "b"), runs(sp), runs(rel, sp), commit},
			want: []idempotent.Outcome{a, a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{t: t, steps: tc.steps}
			c := idempotent.Coalescing{Savepoints: tc.savepoints, LockWait: -1}
			if tc.bounded {
				c.LockWait = 0
			}
			res := scriptedGroup(t, s, c, tc.keys, tc.fn)
			if o := tc.other; o != nil { // a key given twice, in an order of its callers' arrival
				if (res[0] != coResult{outcome: a} || !sameResult(res[1], *o)) && (res[1] != coResult{outcome: a} || !sameResult(res[0], *o)) {
					t.Fatalf("got %v, want one applied and the other %v", res, *o)
				}
				return
			}
			for i, r := range res {
				var want error
				if tc.wantErr != nil {
					want = tc.wantErr[i]
				}
				if r.outcome != tc.want[i] || (want == nil) != (r.err == nil) || !errors.Is(r.err, want) {
					t.Errorf("call %d (%s): %v, %v; want %v, %v", i, tc.keys[i], r.outcome, r.err, tc.want[i], want)
				}
			}
		})
	}
}

// sameResult reports whether r is want, its error matching want's.
func sameResult(r, want coResult) bool {
	return r.outcome == want.outcome && (r.err == nil) == (want.err == nil) && errors.Is(r.err, want.err)
}

// TestWithCoalescingBounds: the core's bounds, checked by New, and the
// bound reported by Config.
func TestWithCoalescingBounds(t *testing.T) {
	db, err := sql.Open("pgx", "postgres://unused.invalid/x")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range []idempotent.Coalescing{{}, {Max: 1, Wait: time.Millisecond}, {Max: idempotent.MaxBatchSize + 1, Wait: time.Millisecond}, {Max: 8}, {Max: 8, Wait: 2 * time.Second}} {
		if _, err := newMiddleware(db, "orders", []Option{WithCoalescing(c)}); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
	c := idempotent.Coalescing{Max: 8, Wait: time.Millisecond, Savepoints: true}
	m, err := newMiddleware(db, "orders", []Option{WithCoalescing(c)})
	if err != nil || m.Config().Coalescing != c || m.co == nil {
		t.Fatalf("got (%+v, %v), want %+v", m.Config().Coalescing, err, c)
	}
}
