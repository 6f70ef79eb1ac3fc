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
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// coResult is one coalesced call's result.
type coResult struct {
	outcome idempotent.Outcome
	err     error
}

// scriptedGroup calls ProcessMessage once per key at the same time on a
// scripted Middleware whose groups close at len(keys) members, with
// fn(i) as the i-th call's handler, and returns the results in the order of
// keys. c gives the design and the lock wait bound. The optimistic design's
// fence token is "tok".
func scriptedGroup(t *testing.T, s *script, c idempotent.Coalescing, keys []string, fn func(i int) Func) []coResult {
	t.Helper()
	s.soft = true
	c.Max, c.Wait = len(keys), time.Second
	m := scripted(t, s, WithCoalescing(c))
	m.co.token = func() string { return "tok" }
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

// TestCoalescedSequence: the statements of a coalesced group. Each
// message's claim is one round trip, sent just before its handler: the
// first with BEGIN and the fence (optimistic) or its SAVEPOINT; a later
// one, with savepoints, after the RELEASE of the previous message's
// savepoint and its own SAVEPOINT. COMMIT goes after the fence's check, or
// the last RELEASE. A handler that ends the group's transaction fails
// alone, found by the connection's status or by the next check.
func TestCoalescedSequence(t *testing.T) {
	pg := postgres.New()
	table := dialect.Table{Name: "processed_messages"}
	fence, check, fclaim := pg.TxFenceSQL(0), pg.TxFenceCheckSQL(), pg.TxFencedClaimSQL(table, false, false)
	sp, rel := dialect.MessageSavepointSQL, dialect.MessageReleaseSQL
	lw := "SET LOCAL lock_timeout = 50" // Coalescing.LockWait's default
	tag := func(inserted bool) string {
		if inserted {
			return "INSERT 0 1"
		}
		return "INSERT 0 0"
	}
	// claim is a claim round trip of the optimistic design; the first of a
	// transaction has BEGIN and the fence (fenceSQL) in front.
	claim := func(key string, inserted bool, fenceSQL ...string) step {
		sql, tags := []string{fclaim}, []string{tag(inserted)}
		if len(fenceSQL) > 0 {
			sql, tags = []string{"begin", fenceSQL[0], fclaim}, []string{"BEGIN", "SELECT 1", tag(inserted)}
		}
		return step{sql: sql, tags: tags, args: []any{"orders", key, "tok"}, status: 'T'}
	}
	// spClaim is a claim round trip with savepoints, with before in front.
	spClaim := func(key string, inserted bool, before ...string) step {
		tags := make([]string, len(before))
		for i, s := range before {
			tags[i] = strings.ToUpper(strings.Fields(s)[0])
		}
		return step{sql: append(before, claimSQL), tags: append(tags, tag(inserted)), args: []any{"orders", key}, status: 'T'}
	}
	failed := func(err error, sql ...string) step { return step{sql: sql, err: err, status: 'E'} }
	runs := step{sql: []string{effect}, tags: []string{"UPDATE 1"}, status: 'T'}
	commit := step{sql: []string{check, "commit"}, tags: []string{"SELECT 1", "COMMIT"}, status: 'I'}
	spCommit := step{sql: []string{rel, "commit"}, tags: []string{"RELEASE", "COMMIT"}, status: 'I'}
	rollback := step{sql: []string{"rollback"}, tags: []string{"ROLLBACK"}, status: 'I'}
	checkedRollback := step{sql: []string{check, "rollback"}, tags: []string{"SELECT 1", "ROLLBACK"}, status: 'I'}
	undo := step{sql: []string{dialect.MessageRollbackSQL + "; " + rel}, tags: []string{"RELEASE"}, args: []any{pgx.QueryExecModeSimpleProtocol}, status: 'T'}
	alone := func(key string) []step {
		return []step{{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, args: []any{"orders", key}, status: 'T'}, runs,
			{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'}}
	}
	fenceBroken := &pgconn.PgError{Code: "22012"}
	noSavepoint := &pgconn.PgError{Code: "3B001"}
	effectThen := func(err error) Func {
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, xerr := tx.Exec(ctx, effect); xerr != nil {
				return xerr
			}
			return err
		}
	}
	ok := func(int) Func { return effectThen(nil) }
	// culprit is fn with the handler of call i replaced by h.
	culprit := func(i int, h Func) func(int) Func {
		return func(j int) Func {
			if j == i {
				return h
			}
			return effectThen(nil)
		}
	}
	reopen := func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT; BEGIN"); return err }
	reopened := step{sql: []string{"COMMIT; BEGIN"}, tags: []string{"BEGIN"}, status: 'T'}
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
		{name: "optimistic: begin, the fence and the first claim in one batch; each claim before its handler; the check with commit",
			keys: []string{"b", "a", "c"}, fn: ok,
			steps: []step{claim("a", true, fence), runs, claim("b", false), claim("c", true), runs, commit},
			want:  []idempotent.Outcome{d, a, a}},
		{name: "optimistic: a failed handler: the check rides with rollback; the group runs again without it",
			keys: []string{"a", "b"}, fn: func(i int) Func { return effectThen([]error{nil, errBoom}[i]) },
			steps:   []step{claim("a", true, fence), runs, claim("b", true), runs, checkedRollback, claim("a", true, fence), runs, commit},
			want:    []idempotent.Outcome{a, 0},
			wantErr: []error{nil, errBoom}},
		{name: "optimistic: the lock wait bound rides in the fence",
			bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{claim("a", true, pg.TxFenceSQL(50*time.Millisecond)), runs, claim("b", true), runs, commit},
			want:  []idempotent.Outcome{a, a}},
		{name: "optimistic: a swallowed failed statement: plain rollback, the group runs again without it",
			keys: []string{"a", "b"}, fn: culprit(0, func(ctx context.Context, tx pgx.Tx) error { _, _ = tx.Exec(ctx, effect); return nil }),
			steps:   []step{claim("a", true, fence), failed(errBoom, effect), rollback, claim("b", true, fence), runs, commit},
			want:    []idempotent.Outcome{0, a},
			wantErr: []error{pgx.ErrTxCommitRollback, nil}},
		{name: "optimistic: a handler that ran COMMIT: the connection is idle; it fails alone, the others run again",
			keys: []string{"a", "b", "c"}, fn: culprit(1, func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err }),
			steps: []step{claim("a", true, fence), runs, claim("b", true), {sql: []string{"COMMIT"}, tags: []string{"COMMIT"}, status: 'I'},
				claim("a", false, fence), claim("c", true), runs, commit},
			want:    []idempotent.Outcome{d, 0, a},
			wantErr: []error{nil, idempotent.ErrAutocommit, nil}},
		{name: "optimistic: a handler that ran COMMIT; BEGIN: the next claim's fence fails; it fails alone, the others run again",
			keys: []string{"a", "b", "c"}, fn: culprit(1, reopen),
			steps: []step{claim("a", true, fence), runs, claim("b", true), reopened, failed(fenceBroken, fclaim), rollback,
				claim("a", false, fence), claim("c", true), runs, commit},
			want:    []idempotent.Outcome{d, 0, a},
			wantErr: []error{nil, idempotent.ErrAutocommit, nil}},
		{name: "optimistic: the last handler ran COMMIT; BEGIN: the check fails and COMMIT is skipped",
			keys: []string{"a", "b"}, fn: culprit(1, reopen),
			steps: []step{claim("a", true, fence), runs, claim("b", true), reopened, failed(fenceBroken, check, "commit"), rollback,
				claim("a", false, fence), rollback},
			want:    []idempotent.Outcome{d, 0},
			wantErr: []error{nil, idempotent.ErrAutocommit}},
		{name: "optimistic: COMMIT; BEGIN, then the handler's own error: the check with rollback fails, its error says so",
			keys: []string{"a", "b"}, fn: culprit(1, func(ctx context.Context, tx pgx.Tx) error { _ = reopen(ctx, tx); return errBoom }),
			steps: []step{claim("a", true, fence), runs, claim("b", true), reopened, failed(fenceBroken, check, "rollback"), rollback,
				claim("a", false, fence), rollback},
			want:    []idempotent.Outcome{d, 0},
			wantErr: []error{nil, idempotent.ErrAutocommit}},
		{name: "savepoints: each SAVEPOINT and the RELEASE before it ride with the claim, the last RELEASE with commit",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: ok,
			steps: []step{spClaim("a", true, "begin", sp), runs, spClaim("b", true, rel, sp), runs, spClaim("c", true, rel, sp), runs, spCommit},
			want:  []idempotent.Outcome{a, a, a}},
		{name: "savepoints: duplicates run no handler",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: ok,
			steps: []step{spClaim("a", false, "begin", sp), spClaim("b", true, rel, sp), runs, spClaim("c", false, rel, sp), spCommit},
			want:  []idempotent.Outcome{d, a, d}},
		{name: "savepoints: the lock wait bound rides before the first savepoint",
			savepoints: true, bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{spClaim("a", true, "begin", lw, sp), runs, spClaim("b", true, rel, sp), runs, spCommit},
			want:  []idempotent.Outcome{a, a}},
		{name: "savepoints: a handler past the lock wait bound is undone to its savepoint and runs alone",
			savepoints: true, bounded: true, keys: []string{"a", "b"}, fn: ok,
			steps: append([]step{spClaim("a", true, "begin", lw, sp), failed(errLockTimeout, effect), undo, spClaim("b", true, sp), runs, spCommit},
				alone("a")...),
			want: []idempotent.Outcome{a, a}},
		{name: "savepoints: a key given twice: the second is a duplicate at no round trip",
			savepoints: true, keys: []string{"a", "a"}, fn: ok,
			steps: []step{spClaim("a", true, "begin", sp), runs, spCommit}, other: &coResult{outcome: d}},
		{name: "savepoints: a failed handler is undone to its savepoint, its claim with it; the others run once",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: func(i int) Func { return effectThen([]error{nil, errBoom, nil}[i]) },
			steps:   []step{spClaim("a", true, "begin", sp), runs, spClaim("b", true, rel, sp), runs, undo, spClaim("c", true, sp), runs, spCommit},
			want:    []idempotent.Outcome{a, 0, a},
			wantErr: []error{nil, errBoom, nil}},
		{name: "savepoints: a failed handler of a key given twice: the other claims it again",
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
			steps: []step{spClaim("k", true, "begin", sp), runs, undo, spClaim("k", true, sp), runs, spCommit}, other: &coResult{err: errBoom}},
		{name: "savepoints: a swallowed failed statement is undone to its savepoint",
			savepoints: true, keys: []string{"a", "b"}, fn: culprit(0, func(ctx context.Context, tx pgx.Tx) error { _, _ = tx.Exec(ctx, effect); return nil }),
			steps:   []step{spClaim("a", true, "begin", sp), failed(errBoom, effect), undo, spClaim("b", true, sp), runs, spCommit},
			want:    []idempotent.Outcome{0, a},
			wantErr: []error{pgx.ErrTxCommitRollback, nil}},
		{name: "savepoints: every new message failed: rolled back, not committed",
			savepoints: true, keys: []string{"a", "b"}, fn: func(i int) Func { return effectThen([]error{errBoom, nil}[i]) },
			steps:   []step{spClaim("a", true, "begin", sp), runs, undo, spClaim("b", false, sp), rollback},
			want:    []idempotent.Outcome{0, d},
			wantErr: []error{errBoom, nil}},
		{name: "savepoints: a handler that ran COMMIT; BEGIN: the RELEASE with the next claim fails; it fails alone",
			savepoints: true, keys: []string{"a", "b", "c"}, fn: culprit(1, reopen),
			steps: []step{spClaim("a", true, "begin", sp), runs, spClaim("b", true, rel, sp), reopened, failed(noSavepoint, rel, sp, claimSQL), rollback,
				spClaim("a", false, "begin", sp), spClaim("c", true, rel, sp), runs, spCommit},
			want:    []idempotent.Outcome{d, 0, a},
			wantErr: []error{nil, idempotent.ErrAutocommit, nil}},
		{name: "savepoints: a serialization failure of the group's transaction retries the group",
			savepoints: true, keys: []string{"a", "b"}, fn: ok,
			steps: []step{spClaim("a", true, "begin", sp), runs, spClaim("b", true, rel, sp), failed(errSerialization, effect), rollback,
				spClaim("a", true, "begin", sp), runs, spClaim("b", true, rel, sp), runs, spCommit},
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
