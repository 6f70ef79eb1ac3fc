package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// checkTimeout bounds every check, so a dialect that hangs fails instead
// of stalling the test binary.
const checkTimeout = 2 * time.Minute

// waitBeforeRelease is how long a take-over check lets the waiting delivery
// reach its wait before the holder ends. It is no assertion: if the machine
// is slower, the waiting delivery arrives after the release and the check
// still passes, having checked less.
const waitBeforeRelease = 300 * time.Millisecond

type check struct {
	name string
	run  func(t *testing.T, e *Env)
}

func checks() []check {
	return []check{
		{"EnsureSchema", checkEnsureSchema},
		{"ClaimOnce", checkClaimOnce},
		{"KeysByteExact", checkKeysByteExact},
		{"CallerTransaction", checkCallerTransaction},
		{"HandlerErrorRollsBack", checkHandlerError},
		{"ConcurrentDuplicates/8", func(t *testing.T, e *Env) { checkConcurrentDuplicates(t, e, 8) }},
		{"ConcurrentDuplicates/32", func(t *testing.T, e *Env) { checkConcurrentDuplicates(t, e, 32) }},
		{"ConcurrentDistinct", checkConcurrentDistinct},
		{"TakeOver/RolledBack", func(t *testing.T, e *Env) { checkTakeOver(t, e, false) }},
		{"TakeOver/Committed", func(t *testing.T, e *Env) { checkTakeOver(t, e, true) }},
		{"RealErrors/Deadlock", checkDeadlock},
		{"RealErrors/LostSession", checkLostSession},
		{"RealErrors/Provoked", checkProvoked},
		{"LockTimeout", checkLockTimeout},
		{"StrictGuard", checkStrictGuard},
		{"BadKeys", checkBadKeys},
		{"BadTableNames", checkBadTableNames},
		{"MissingTable", checkMissingTable},
		{"BatchClaim", checkBatchClaim},
		{"LockTimeoutRestored/Claim", func(t *testing.T, e *Env) { checkLockTimeoutRestored(t, e, false) }},
		{"LockTimeoutRestored/BatchClaim", func(t *testing.T, e *Env) { checkLockTimeoutRestored(t, e, true) }},
		{"ImplicitCommit", checkImplicitCommit},
		{"IsolationLevels", checkIsolationLevels},
		{"SeenTablesApart", checkSeenTablesApart},
		// The optional interfaces of package dialect, checked where the
		// dialect implements them and skipped where it does not.
		{"Optional/Cleaner/Middleware", checkCleaner},
		{"Optional/Cleaner/Exact", checkCleanerExact},
		{"Optional/Cleaner/Concurrent", checkCleanerConcurrent},
		{"Optional/Cleaner/LockNoWait", checkCleanerLockNoWait},
		{"Optional/StatsReader", checkStatsReader},
		{"Optional/HorizonKeeper", checkHorizonKeeper},
		{"Optional/Partitioner", checkPartitioner},
		{"Optional/Upserter", checkUpserter},
		{"Optional/ClaimFolder", checkClaimFolder},
		{"Optional/Identifier", checkIdentifier},
		{"Optional/Orderer/Shuffled", checkOrderShuffled},
		{"Optional/Orderer/BatchShuffled", checkOrderBatchShuffled},
		{"Optional/Orderer/CoalescedShuffled", checkOrderCoalescedShuffled},
		{"Optional/Orderer/Batch", checkOrderBatch},
		{"Optional/Orderer/GapSkip", checkOrderGapSkip},
		{"Optional/Orderer/GapDeadLetter", checkOrderGapDeadLetter},
		{"Optional/Orderer/ParkCrash", checkOrderParkCrash},
		{"Optional/Orderer/ReleaseCrash", checkOrderReleaseCrash},
		{"Optional/Orderer/ReleaseCommits", checkOrderReleaseCommits},
		{"Optional/Orderer/StrictGuard", checkOrderStrictGuard},
		{"Optional/Orderer/BadInput", checkOrderBadInput},
		{"Optional/Orderer/Mixed", checkOrderMixed},
		{"Optional/Orderer/TableSkipResend", checkOrderTableSkipResend},
	}
}

// Run runs the conformance suite for h as subtests of t: the checks, one
// after another, each on tables of its own, then the matrix on
// database/sql ("Matrix", see Exercise), whose cells run in parallel —
// with a "guarded" column beside the "plain" one when h.OpenGuarded is set.
func Run(t *testing.T, h Harness) {
	t.Helper()
	e := newEnv(t, h)
	h = e.h
	all := checks()
	for name := range h.Skip {
		if !slices.ContainsFunc(all, func(c check) bool { return c.name == name || strings.HasPrefix(c.name, name+"/") }) {
			t.Fatalf("dialecttest: Harness.Skip names %q, which is not a check", name)
		}
	}
	for _, c := range all {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := skipped(h.Skip, c.name); ok {
				t.Skipf("skipped by the harness: %s", why)
			}
			c.run(t, e)
		})
	}
	names := make([]string, 0, len(h.Extra))
	for name := range h.Extra {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) { h.Extra[name](t, e) })
	}
	t.Run("Matrix", func(t *testing.T) { exercise(t, e, sqlDrivers(e)...) })
}

func skipped(skip map[string]string, name string) (string, bool) {
	for n, why := range skip {
		if n == name || strings.HasPrefix(name, n+"/") {
			return why, true
		}
	}
	return "", false
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	t.Cleanup(cancel)
	return ctx
}

// setup opens a database, names a table and returns a middleware on it.
func setup(t *testing.T, e *Env, opts ...idempotent.Option) (*sql.DB, string, *idempotent.Middleware) {
	t.Helper()
	db := e.DB(t)
	table := e.Table(t, db)
	return db, table, e.Middleware(t, db, table, "conformance", opts...)
}

func checkEnsureSchema(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatalf("second EnsureSchema: %v", err)
	}
	// Several processes starting at once, each with its own pool.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		other := e.DB(t)
		m, err := idempotent.New(other, e.h.Dialect, "conformance", idempotent.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.EnsureSchema(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent EnsureSchema %d: %v", i, err)
		}
	}
	// The table has the guide's columns.
	if _, err := db.ExecContext(ctx, "SELECT consumer, message_key, processed_at FROM "+table+" WHERE 1 = 0"); err != nil {
		t.Errorf("claim table lacks the guide's columns: %v", err)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "after-schema"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
		t.Errorf("ProcessMessage after EnsureSchema x6 = %v, %v; want applied", out, err)
	}
	if got := e.Claims(t, db, table); len(got) != 1 {
		t.Errorf("claims after EnsureSchema x6 and one ProcessMessage: %q, want one", got)
	}
	checkEnsureSchemaBehindAClaim(t, e, mw, table)
}

// checkEnsureSchemaBehindAClaim: with the schema complete, a process
// starting while a handler holds a claim open runs EnsureSchema to the end
// while the claim is still held: it must not wait for the claim (and make
// every new claim wait behind it). A dialect whose EnsureSchema does wait
// fails here once its DDL lock timeout (or, lacking one, the bound of the
// wait) runs out.
func checkEnsureSchemaBehindAClaim(t *testing.T, e *Env, mw *idempotent.Middleware, table string) {
	t.Helper()
	ctx := testContext(t)
	claimed, free := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "held-during-schema"}, func(context.Context, *sql.Tx) error {
			close(claimed)
			<-free
			return nil
		})
		held <- err
	}()
	select {
	case <-claimed:
	case err := <-held:
		t.Fatalf("holding a claim: %v", err)
	}
	other := e.DB(t)
	starting, err := idempotent.NewClaimTable(other, e.h.Dialect, idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*idempotent.PartitionLockTimeout)
	err = starting.EnsureSchema(wctx)
	cancel()
	close(free)
	if err != nil {
		t.Errorf("EnsureSchema of the complete schema while a handler holds a claim: %v; want it to return without waiting for the claim", err)
	}
	if err := <-held; err != nil {
		t.Errorf("the held claim: %v", err)
	}
}

func checkClaimOnce(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 1)
	bump := func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }

	want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate}
	for i, w := range want {
		out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, bump)
		if err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
		if out != w {
			t.Errorf("delivery %d = %v, want %v", i+1, out, w)
		}
	}
	if n := fx.Get(t, 1); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
	// Another consumer has claims of its own.
	other := e.Middleware(t, db, table, "analytics")
	if out, err := other.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, bump); err != nil || out != idempotent.Applied {
		t.Errorf("another consumer, same key = %v, %v; want applied", out, err)
	}
	if out, err := other.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, bump); err != nil || out != idempotent.Duplicate {
		t.Errorf("another consumer, again = %v, %v; want duplicate", out, err)
	}
	if n := fx.Get(t, 1); n != 2 {
		t.Errorf("effect count %d after two consumers, want 2", n)
	}
	if got := e.Claims(t, db, table); len(got) != 2 {
		t.Errorf("claims %q, want two", got)
	}
}

func checkKeysByteExact(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	max := e.h.Dialect.MaxKeyBytes()
	if max < 64 {
		t.Fatalf("MaxKeyBytes() = %d: keys such as event UUIDs and natural keys need at least 64 bytes", max)
	}
	// Pairs that a case-insensitive, accent-insensitive, PAD SPACE or
	// normalising comparison would equate: each must be its own key.
	keys := []string{
		"A", "a", "x", "x ", " x", "é", "e\u0301", "ß", "ss", "İ", "i",
		"tab\tkey", "line\nkey", "quote'key", `back\slash`, "😀",
		strings.Repeat("k", max),
		strings.Repeat("é", max/2) + strings.Repeat("k", max%2),
	}
	for _, k := range keys {
		out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, func(context.Context, *sql.Tx) error { return nil })
		if err != nil {
			t.Fatalf("key %s: %v", short(k), err)
		}
		if out != idempotent.Applied {
			t.Errorf("key %s = %v, want applied: the dialect equates it with an earlier key", short(k), out)
		}
	}
	got := e.Claims(t, db, table)
	wantKeys := slices.Clone(keys)
	slices.Sort(wantKeys)
	slices.Sort(got)
	if !slices.Equal(got, wantKeys) {
		t.Errorf("stored keys differ from the keys claimed (lost, altered or padded):\n got %s\nwant %s", shortAll(got), shortAll(wantKeys))
	}
	for _, k := range keys {
		if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Duplicate {
			t.Errorf("key %s again = %v, %v; want duplicate", short(k), out, err)
		}
	}
}

// short quotes a key for a message, cutting a long one.
func short(k string) string {
	if len(k) <= 40 {
		return fmt.Sprintf("%q", k)
	}
	return fmt.Sprintf("%q… (%d bytes)", k[:40], len(k))
}

func shortAll(keys []string) string {
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = short(k)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func checkCallerTransaction(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	claim := func(commit bool) bool {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "caller-owned"})
		if err != nil {
			_ = tx.Rollback()
			t.Fatalf("Claim: %v", err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return claimed
	}
	if !claim(false) {
		t.Error("first Claim (rolled back) = false, want true")
	}
	if !claim(true) {
		t.Error("Claim after a rolled-back claim = false, want true")
	}
	if claim(true) {
		t.Error("Claim after a committed claim = true, want false")
	}
	if got := e.Claims(t, db, table); len(got) != 1 {
		t.Errorf("claims %q, want one", got)
	}
}

func checkHandlerError(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 1)
	boom := errors.New("handler failed")
	_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := fx.Bump(ctx, tx, 1); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("ProcessMessage = %v, want the handler's error", err)
	}
	if n, claims := fx.Get(t, 1), e.Claims(t, db, table); n != 0 || len(claims) != 0 {
		t.Fatalf("after a failed handler: effect %d, claims %q; want both rolled back", n, claims)
	}
	func() {
		defer func() {
			if r := recover(); r != "handler panicked" {
				t.Errorf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error {
			if err := fx.Bump(ctx, tx, 1); err != nil {
				return err
			}
			panic("handler panicked")
		})
	}()
	if n, claims := fx.Get(t, 1), e.Claims(t, db, table); n != 0 || len(claims) != 0 {
		t.Fatalf("after a panicking handler: effect %d, claims %q; want both rolled back", n, claims)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }); err != nil || out != idempotent.Applied {
		t.Fatalf("redelivery = %v, %v; want applied", out, err)
	}
	if n := fx.Get(t, 1); n != 1 {
		t.Errorf("effect %d, want 1", n)
	}
}

// outcomes runs n deliveries at once, each with its own key from key(i),
// and returns their outcomes and errors.
func concurrently(ctx context.Context, n int, deliver func(ctx context.Context, i int) (idempotent.Outcome, error)) ([]idempotent.Outcome, []error) {
	outs := make([]idempotent.Outcome, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			outs[i], errs[i] = deliver(ctx, i)
		}()
	}
	close(start)
	wg.Wait()
	return outs, errs
}

func checkConcurrentDuplicates(t *testing.T, e *Env, n int) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 1)
	outs, errs := concurrently(ctx, n, func(ctx context.Context, _ int) (idempotent.Outcome, error) {
		return mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
			// Hold the claim a moment, so the others pile up behind it.
			time.Sleep(20 * time.Millisecond)
			return fx.Bump(ctx, tx, 1)
		})
	})
	applied, dup := 0, 0
	for i := range outs {
		switch {
		case errs[i] != nil:
			t.Errorf("delivery %d: %v", i, errs[i])
		case outs[i] == idempotent.Applied:
			applied++
		case outs[i] == idempotent.Duplicate:
			dup++
		}
	}
	if applied != 1 || dup != n-1 {
		t.Errorf("%d concurrent deliveries: %d applied, %d duplicate; want 1 and %d", n, applied, dup, n-1)
	}
	if c := fx.Get(t, 1); c != 1 {
		t.Errorf("effect applied %d times, want 1", c)
	}
}

func checkConcurrentDistinct(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 32)
	outs, errs := concurrently(ctx, 32, func(ctx context.Context, i int) (idempotent.Outcome, error) {
		return mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("key-%d", i)}, func(ctx context.Context, tx *sql.Tx) error {
			return fx.Bump(ctx, tx, i+1)
		})
	})
	for i := range outs {
		if errs[i] != nil || outs[i] != idempotent.Applied {
			t.Errorf("key-%d = %v, %v; want applied", i, outs[i], errs[i])
		}
		if c := fx.Get(t, i+1); c != 1 {
			t.Errorf("key-%d: effect %d, want 1", i, c)
		}
	}
	if got := e.Claims(t, db, table); len(got) != 32 {
		t.Errorf("%d claims, want 32", len(got))
	}
}

// checkTakeOver holds a claim in a transaction of its own while a delivery
// of the same key waits, then ends the holder. The waiting delivery applies
// the effect if the holder rolled back, and is a duplicate if it committed.
// On a database with row locks the delivery waits at its claim; with
// SerialWriters, at BEGIN. The outcome must be the same.
func checkTakeOver(t *testing.T, e *Env, commit bool) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 1)
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if claimed, err := mw.ClaimMessage(ctx, holder, idempotent.Message{Key: "k"}); err != nil || !claimed {
		t.Fatalf("holder's Claim = %v, %v", claimed, err)
	}
	if err := fx.Bump(ctx, holder, 1); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out idempotent.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) })
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the duplicate did not wait for the holder: %v, %v", r.out, r.err)
	case <-time.After(waitBeforeRelease):
	}
	if commit {
		err = holder.Commit()
	} else {
		err = holder.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	want := idempotent.Applied
	if commit {
		want = idempotent.Duplicate
	}
	if r.err != nil || r.out != want {
		t.Fatalf("waiting delivery = %v, %v; want %v", r.out, r.err, want)
	}
	if n := fx.Get(t, 1); n != 1 {
		t.Errorf("effect %d, want exactly 1", n)
	}
}

// retryLog is an observer that keeps every retry.
type retryLog struct {
	mu      sync.Mutex
	retries []idempotent.RetryEvent
}

func (r *retryLog) Outcome(context.Context, idempotent.Event) {}

func (r *retryLog) Retry(_ context.Context, ev idempotent.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries = append(r.retries, ev)
}

func (r *retryLog) all() []idempotent.RetryEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.retries)
}

// checkDeadlock runs two deliveries whose handlers update two rows in
// opposite orders, meeting in the middle on their first attempt: a real
// deadlock. The database aborts one; the dialect must call that a
// serialization failure, and the middleware must retry it to success.
func checkDeadlock(t *testing.T, e *Env) {
	if e.h.SerialWriters {
		t.Skip("SerialWriters: transactions cannot deadlock; the harness's Provokers supply the retryable errors")
	}
	ctx := testContext(t)
	log := &retryLog{}
	db, table, mw := setup(t, e, idempotent.WithObserver(log))
	fx := e.NewEffects(t, db, table, 2)
	var firstDone [2]chan struct{}
	firstDone[0], firstDone[1] = make(chan struct{}), make(chan struct{})
	var attempts [2]atomic.Int32
	outs, errs := concurrently(ctx, 2, func(ctx context.Context, i int) (idempotent.Outcome, error) {
		first, second := i+1, 2-i
		return mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("deadlock-%d", i)}, func(ctx context.Context, tx *sql.Tx) error {
			if err := fx.Bump(ctx, tx, first); err != nil {
				return err
			}
			if attempts[i].Add(1) == 1 {
				close(firstDone[i])
				select { // wait until the other holds its first row
				case <-firstDone[1-i]:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return fx.Bump(ctx, tx, second)
		})
	})
	for i := range outs {
		if errs[i] != nil || outs[i] != idempotent.Applied {
			t.Errorf("delivery %d = %v, %v; want applied after a retry", i, outs[i], errs[i])
		}
	}
	if a, b := fx.Get(t, 1), fx.Get(t, 2); a != 2 || b != 2 {
		t.Errorf("counters %d, %d; want 2, 2 (each delivery's effect once)", a, b)
	}
	retries := log.all()
	if len(retries) == 0 {
		t.Fatal("no retry: the deadlock was not classified as retryable, or never happened")
	}
	for _, ev := range retries {
		c := e.h.Dialect.Classify(ev.Err)
		t.Logf("deadlock: %v classified %v, code %q", ev.Err, c.Kind, c.Code)
		if c.Kind != dialect.KindSerialization || c.Code == "" {
			t.Errorf("deadlock classified %+v, want KindSerialization with the database's code", c)
		}
		if ev.Reason != dialect.KindSerialization.String() {
			t.Errorf("retry reason %q, want %q", ev.Reason, dialect.KindSerialization)
		}
	}
}

// checkLostSession kills the session of a delivery's first attempt from
// outside. The next statement fails with a lost connection, which the
// dialect must classify as KindConnection; the middleware retries on a new
// connection and applies the effect exactly once.
func checkLostSession(t *testing.T, e *Env) {
	if e.h.KillSession == nil {
		t.Skip("the harness cannot kill a session (Harness.KillSession is nil)")
	}
	ctx := testContext(t)
	log := &retryLog{}
	db, table, mw := setup(t, e, idempotent.WithObserver(log))
	fx := e.NewEffects(t, db, table, 1)
	admin := e.DB(t)
	var attempts atomic.Int32
	out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "lost-session"}, func(ctx context.Context, tx *sql.Tx) error {
		if attempts.Add(1) == 1 {
			e.h.KillSession(t, tx, admin)
		}
		return fx.Bump(ctx, tx, 1)
	})
	if err != nil || out != idempotent.Applied {
		t.Fatalf("ProcessMessage = %v, %v; want applied after a retry", out, err)
	}
	if n := fx.Get(t, 1); n != 1 {
		t.Errorf("effect %d, want 1", n)
	}
	retries := log.all()
	if len(retries) == 0 {
		t.Fatal("no retry after the session was killed")
	}
	for _, ev := range retries {
		c := e.h.Dialect.Classify(ev.Err)
		t.Logf("lost session: %v classified %v, code %q", ev.Err, c.Kind, c.Code)
		if c.Kind != dialect.KindConnection {
			t.Errorf("killed session classified %+v, want KindConnection", c)
		}
	}
}

func checkProvoked(t *testing.T, e *Env) {
	retryable := !e.h.SerialWriters // the deadlock check covers it
	for _, p := range e.h.Provokers {
		t.Run(p.Name, func(t *testing.T) {
			db := e.DB(t)
			table := e.Table(t, db)
			err := p.Provoke(t, db, table)
			if err == nil {
				t.Fatal("the provoker returned no error")
			}
			for _, err := range []error{err, fmt.Errorf("wrapped: %w", err)} {
				c := e.h.Dialect.Classify(err)
				t.Logf("%v classified %v, code %q", err, c.Kind, c.Code)
				if c.Kind != p.Want {
					t.Errorf("Classify(%v) = %v, want %v", err, c.Kind, p.Want)
				}
				if c.Code == "" && p.Want != dialect.KindConnection {
					t.Errorf("Classify(%v) gave no code", err)
				}
			}
		})
		if (dialect.Class{Kind: p.Want}).Retryable() {
			retryable = true
		}
	}
	if !retryable {
		t.Error("no real retryable error is checked: with SerialWriters, give a Provoker whose Want is retryable")
	}
}

func checkLockTimeout(t *testing.T, e *Env) {
	ctx := testContext(t)
	d := e.h.Dialect
	const timeout = 200 * time.Millisecond
	if d.LockTimeoutSQL(timeout) == "" {
		db := e.DB(t)
		_, err := idempotent.New(db, d, "conformance", idempotent.WithLockTimeout(timeout))
		if err == nil || !strings.Contains(err.Error(), d.Name()) {
			t.Fatalf("the dialect cannot bound lock waits, so New(WithLockTimeout) must fail naming it; got %v", err)
		}
		t.Logf("unsupported, as New says: %v", err)
		return
	}
	db, table, mw := setup(t, e, idempotent.WithLockTimeout(timeout))
	fx := e.NewEffects(t, db, table, 1)
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "free"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }); err != nil || out != idempotent.Applied {
		t.Fatalf("uncontended ProcessMessage with a lock timeout = %v, %v", out, err)
	}
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	plain := e.Middleware(t, db, table, "conformance")
	if claimed, err := plain.ClaimMessage(ctx, holder, idempotent.Message{Key: "held"}); err != nil || !claimed {
		t.Fatalf("holder's Claim = %v, %v", claimed, err)
	}
	ran := false
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "held"}, func(ctx context.Context, tx *sql.Tx) error {
		ran = true
		return fx.Bump(ctx, tx, 1)
	})
	if !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("ProcessMessage behind a held claim = %v, want ErrClaimBusy", err)
	}
	t.Logf("lock timeout: %v", err)
	if ran {
		t.Error("the handler ran although the claim timed out")
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n, claims := fx.Get(t, 1), e.Claims(t, db, table); n != 1 || len(claims) != 1 {
		t.Errorf("after the timeout: effect %d, claims %q; want 1 and only the uncontended one", n, claims)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "held"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }); err != nil || out != idempotent.Applied {
		t.Errorf("redelivery after the holder rolled back = %v, %v; want applied", out, err)
	}
}

func checkStrictGuard(t *testing.T, e *Env) {
	ctx := testContext(t)
	d := e.h.Dialect
	if d.TxIDSQL() == "" {
		db := e.DB(t)
		_, err := idempotent.New(db, d, "conformance", idempotent.WithStrictGuard())
		if err == nil || !strings.Contains(err.Error(), d.Name()) {
			t.Fatalf("the dialect cannot identify transactions, so New(WithStrictGuard) must fail naming it; got %v", err)
		}
		t.Logf("unsupported, as New says: %v", err)
		return
	}
	db, table, mw := setup(t, e, idempotent.WithStrictGuard())
	fx := e.NewEffects(t, db, table, 1)
	// No false alarm, also under concurrency.
	outs, errs := concurrently(ctx, 8, func(ctx context.Context, i int) (idempotent.Outcome, error) {
		return mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("guarded-%d", i)}, func(ctx context.Context, tx *sql.Tx) error {
			return fx.Bump(ctx, tx, 1)
		})
	})
	for i := range outs {
		if errs[i] != nil || outs[i] != idempotent.Applied {
			t.Errorf("guarded delivery %d = %v, %v; want applied", i, outs[i], errs[i])
		}
	}
	// A handler that commits by itself is caught.
	_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "commits-itself"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := fx.Bump(ctx, tx, 1); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "COMMIT")
		return err
	})
	if !errors.Is(err, idempotent.ErrAutocommit) {
		t.Fatalf("a handler running COMMIT: %v, want ErrAutocommit", err)
	}
	t.Logf("strict guard: %v", err)
}

func checkBadKeys(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	max := e.h.Dialect.MaxKeyBytes()
	for name, key := range map[string]string{
		"empty":             "",
		"NUL":               "order\x00completed",
		"invalid UTF-8":     "order-\xff\xfe",
		"over MaxKeyBytes":  strings.Repeat("k", max+1),
		"over by multibyte": strings.Repeat("k", max-1) + "é",
	} {
		ran := false
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { ran = true; return nil })
		if !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Errorf("%s: ProcessMessage = %v, want ErrInvalidKey", name, err)
		}
		if ran {
			t.Errorf("%s: the handler ran", name)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: key}); !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Errorf("%s: Claim = %v, want ErrInvalidKey", name, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.Claims(t, db, table); len(got) != 0 {
		t.Errorf("bad keys wrote claims: %q", got)
	}
}

func checkBadTableNames(t *testing.T, e *Env) {
	db := e.DB(t)
	db.SetMaxIdleConns(0) // any use of db would now open and close a connection
	before := db.Stats()
	for _, name := range []string{
		"", "a.b.c", "1abc", "tab le", "x; DROP TABLE y", `"quoted"`, "`quoted`",
		"name-with-dash", ".leading", "trailing.", strings.Repeat("n", dialect.MaxIdentifierBytes+1), "ünïcode",
	} {
		_, err := idempotent.New(db, e.h.Dialect, "conformance", idempotent.WithTable(name))
		if !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("WithTable(%q): New = %v, want ErrInvalidIdentifier", name, err)
		}
	}
	// Upper-case letters, which Postgres folds away unquoted and MySQL
	// folds or not by platform, are refused in every dialect, saying why
	// and giving the name to use.
	for name, lower := range map[string]string{"Processed_X": "processed_x", "App.claims": "app.claims", "app.Claims": "app.claims"} {
		_, err := idempotent.New(db, e.h.Dialect, "conformance", idempotent.WithTable(name))
		_, cerr := idempotent.NewClaimTable(db, e.h.Dialect, idempotent.WithTable(name))
		for _, err := range []error{err, cerr} {
			if !errors.Is(err, dialect.ErrInvalidIdentifier) || !strings.Contains(err.Error(), "upper-case letters") || !strings.HasSuffix(err.Error(), "use "+lower) {
				t.Errorf("WithTable(%q) = %v, want ErrInvalidIdentifier saying it has upper-case letters and to use %s", name, err, lower)
			}
		}
	}
	if after := db.Stats(); after != before {
		t.Errorf("New with bad table names used the database (stats %+v, before %+v): it must send nothing", after, before)
	}
}

func checkMissingTable(t *testing.T, e *Env) {
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db)
	mw, err := idempotent.New(db, e.h.Dialect, "conformance", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, idempotent.ErrNoClaimTable) {
		t.Errorf("ProcessMessage without the claim table = %v, want ErrNoClaimTable", err)
	}
	if ran {
		t.Error("the handler ran without a claim table")
	}
}
