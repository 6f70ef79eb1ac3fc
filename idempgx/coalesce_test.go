package idempgx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
)

// Coalesced transactions (WithCoalescing) on the pgx path, on the real
// database. A group closes when it is full (Max is the number of calls a
// test makes at once, the wait a whole second), so a test knows its calls
// shared one transaction; each handler records the backend it ran on and
// the transaction id to prove it.

// coEnv is a pool whose connections are tapped (tap), a schema with a claim
// table and an audit table (one row per applied effect, no unique key, so a
// double application shows).
type coEnv struct {
	p     *pgxpool.Pool
	s     string
	audit string
	tap   *tap
	// queued: apply queues its effect (idempgx.Queue) instead of running
	// it at once; set for the subtests designs names "+queued".
	// queuedOnly: the Middlewares of mw and mwWith are made WithQueuedOnly;
	// set for the subtests queuedOnlyDesigns names "+queuedonly".
	queued, queuedOnly bool
}

// variant reports whether t, or the test it runs in, is named …suffix.
func variant(t *testing.T, suffix string) bool {
	return strings.HasSuffix(t.Name(), suffix) || strings.Contains(t.Name(), suffix+"/")
}

// tap wraps each connection of a pool: it counts writes (each a round
// trip: the middleware waits for the answer to each) and, once armed,
// cuts the connection when the server's answer to a COMMIT arrives, so that
// the commit lands but the client never learns it.
type tap struct {
	writes atomic.Int64
	armed  atomic.Bool
	cut    atomic.Int32
}

type tapConn struct {
	net.Conn
	t *tap
}

func (c *tapConn) Write(b []byte) (int, error) {
	c.t.writes.Add(1)
	return c.Conn.Write(b)
}

// errBoom is a handler's own failure.
var errBoom = errors.New("boom")

// commitComplete is a CommandComplete message with the tag COMMIT.
var commitComplete = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

func (c *tapConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.t.armed.Load() && bytes.Contains(b[:n], commitComplete) && c.t.armed.CompareAndSwap(true, false) {
		c.t.cut.Add(1)
		_ = c.Conn.Close()
		return 0, errors.New("tap: the COMMIT's answer was cut")
	}
	return n, err
}

// newCoEnv returns an environment on a pool of maxConns connections with
// the URL parameters options (an exec mode of execModes, for one).
func newCoEnv(t *testing.T, maxConns int32, options ...string) *coEnv {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withOptions(dsn(t), options...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	e := &coEnv{tap: &tap{}, queued: variant(t, "+queued"), queuedOnly: variant(t, "+queuedonly")}
	e.queued = e.queued || e.queuedOnly
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tapConn{Conn: c, t: e.tap}, nil
	}
	e.p, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.p.Close)
	e.s = tempSchema(t, e.p)
	e.audit = e.s + ".audit"
	exec(t, e.p, "CREATE TABLE "+e.audit+" (k text NOT NULL)")
	return e
}

// mw returns a Middleware on e whose groups close at max members.
func (e *coEnv) mw(t *testing.T, max int, savepoints bool, opts ...idempgx.Option) *idempgx.Middleware {
	t.Helper()
	return e.mwWith(t, idempotent.Coalescing{Max: max, Wait: time.Second, Savepoints: savepoints}, opts...)
}

// mwWith returns a Middleware on e coalescing with c.
func (e *coEnv) mwWith(t *testing.T, c idempotent.Coalescing, opts ...idempgx.Option) *idempgx.Middleware {
	t.Helper()
	opts = append([]idempgx.Option{idempgx.WithCoalescing(c)}, opts...)
	if e.queuedOnly {
		opts = append(opts, idempgx.WithQueuedOnly())
	}
	return e.plain(t, opts...)
}

// plain returns a Middleware on e with opts only.
func (e *coEnv) plain(t *testing.T, opts ...idempgx.Option) *idempgx.Middleware {
	t.Helper()
	opts = append([]idempgx.Option{idempgx.WithTable(e.s + ".claims")}, opts...)
	m, err := idempgx.New(e.p, "co", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// apply is the effect of key k: one audit row, queued when e.queued.
func (e *coEnv) apply(ctx context.Context, tx pgx.Tx, k string) error {
	if e.queued {
		return idempgx.Queue(tx, "INSERT INTO "+e.audit+" (k) VALUES ($1)", k)
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+e.audit+" (k) VALUES ($1)", k)
	return err
}

// wantAudit fails the test unless every key of applied has exactly one
// effect and one claim, and every key of absent none.
func (e *coEnv) wantAudit(t *testing.T, applied, absent []string) {
	t.Helper()
	for _, k := range append(append([]string{}, applied...), absent...) {
		effects := count(t, e.p, "SELECT count(*) FROM "+e.audit+" WHERE k = $1", k)
		claims := count(t, e.p, "SELECT count(*) FROM "+e.s+".claims WHERE consumer = 'co' AND message_key = $1", k)
		want := 0
		for _, a := range applied {
			if a == k {
				want = 1
			}
		}
		if effects != want || claims != want {
			t.Errorf("%s: %d effects and %d claims, want %d and %d", k, effects, claims, want, want)
		}
	}
}

// coCall is one call's result; Tx is the id of the transaction its
// handler last ran in.
type coCall = testenv.Call[int64]

// callAll calls ProcessMessage once per key at the same time, with
// handler(key, its result) as each one's effect, and returns the results
// in the order of keys.
func callAll(m *idempgx.Middleware, keys []string, handler func(k string, r *coCall) idempgx.Func) []coCall {
	return testenv.CallAll(keys, func(k string, r *coCall) (idempotent.Outcome, error) {
		return m.ProcessMessage(context.Background(), idempotent.Message{Key: k}, handler(k, r))
	})
}

// callMessages is callAll for messages with event times: one call per
// message at the same time, fn(msg) as its handler.
func callMessages(m *idempgx.Middleware, msgs []idempotent.Message, fn func(msg idempotent.Message) idempgx.Func) []coCall {
	res := make([]coCall, len(msgs))
	var wg sync.WaitGroup
	for i, msg := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].Outcome, res[i].Err = m.ProcessMessage(context.Background(), msg, fn(msg))
		}()
	}
	wg.Wait()
	return res
}

// recordXID records in r the id of tx's transaction.
func recordXID(ctx context.Context, tx pgx.Tx, r *coCall) error {
	return tx.QueryRow(ctx, "SELECT txid_current()").Scan(&r.Tx)
}

// designs runs test for the optimistic design and with savepoints, each
// with effects run at once and queued (idempgx.Queue): newCoEnv reads the
// subtest's name, "…+queued", for the latter.
func designs(t *testing.T, test func(t *testing.T, savepoints bool)) {
	for _, sp := range []bool{false, true} {
		for _, q := range []string{"", "+queued"} {
			name := "optimistic"
			if sp {
				name = "savepoints"
			}
			t.Run(name+q, func(t *testing.T) {
				t.Parallel()
				test(t, sp)
			})
		}
	}
}

// queuedOnlyDesigns runs test for the optimistic design and with
// savepoints on Middlewares made WithQueuedOnly (newCoEnv reads the
// subtest's name, "…+queuedonly"), whose handlers only queue.
func queuedOnlyDesigns(t *testing.T, test func(t *testing.T, savepoints bool)) {
	for _, sp := range []bool{false, true} {
		name := "optimistic+queuedonly"
		if sp {
			name = "savepoints+queuedonly"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, sp)
		})
	}
}

// runCounter counts each key's handler runs.
type runCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *runCounter) add(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[k]++
}

func (c *runCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

// TestCoalescedHandlerFailsAlone, in each exec mode: one handler's error
// fails its message alone; the others commit in the group's transaction.
func TestCoalescedHandlerFailsAlone(t *testing.T) {
	t.Parallel()
	inExecModes(t, testCoalescedHandlerFailsAlone)
}

// inExecModes runs test in parallel once per exec mode of execModes.
func inExecModes(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range execModes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

func testCoalescedHandlerFailsAlone(t *testing.T, mode string) {
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4, mode)
		bad := errors.New("bad payload")
		keys := []string{"k1", "k2", "k3", "k4"}
		var runs runCounter
		res := callAll(e.mw(t, len(keys), savepoints), keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				runs.add(k)
				if err := recordXID(ctx, tx, r); err != nil {
					return err
				}
				if err := e.apply(ctx, tx, k); err != nil || k != "k2" {
					return err
				}
				return bad
			}
		})
		for i, r := range res {
			if i == 1 {
				if !errors.Is(r.Err, bad) || r.Outcome != 0 {
					t.Errorf("k2: %+v, want its own error", r)
				}
			} else if r.Err != nil || r.Outcome != idempotent.Applied {
				t.Errorf("%s: %+v, want applied", keys[i], r)
			}
		}
		testenv.SameTx(t, res, 0, 2, 3)
		// Optimistic: k1 ran before k2 failed, and again in the group's
		// second transaction; with savepoints nobody runs again.
		want := "map[k1:2 k2:1 k3:1 k4:1]"
		if savepoints {
			want = "map[k1:1 k2:1 k3:1 k4:1]"
			testenv.SameTx(t, res, 0, 1, 2, 3)
		}
		if got := runs.String(); got != want {
			t.Errorf("handler runs %s, want %s", got, want)
		}
		e.wantAudit(t, []string{"k1", "k3", "k4"}, []string{"k2"})
	})
}

// TestCoalescedSwallowedError: a handler that swallows a failed statement
// and returns nil fails its own message (the connection says the
// transaction is aborted); the others commit, and with savepoints do not
// run again.
func TestCoalescedSwallowedError(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		keys := []string{"s1", "s2", "s3"}
		var runs runCounter
		res := callAll(e.mw(t, len(keys), savepoints), keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				runs.add(k)
				if err := e.apply(ctx, tx, k); err != nil || k != "s2" {
					return err
				}
				_, _ = tx.Exec(ctx, "SELECT 1/0")
				return nil
			}
		})
		if !errors.Is(res[1].Err, pgx.ErrTxCommitRollback) || res[0].Outcome != idempotent.Applied || res[2].Outcome != idempotent.Applied {
			t.Fatalf("%+v, want s2 failed with pgx.ErrTxCommitRollback and s1, s3 applied", res)
		}
		// With savepoints the aborted transaction is rolled back to s2's
		// savepoint, and nobody runs again.
		want := "map[s1:2 s2:1 s3:1]"
		if savepoints {
			want = "map[s1:1 s2:1 s3:1]"
		}
		if got := runs.String(); got != want {
			t.Errorf("handler runs %s, want %s", got, want)
		}
		e.wantAudit(t, []string{"s1", "s3"}, []string{"s2"})
	})
}

func TestCoalescedPanic(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		keys := []string{"p1", "p2", "p3"}
		res := callAll(e.mw(t, len(keys), savepoints), keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := recordXID(ctx, tx, r); err != nil {
					return err
				}
				if err := e.apply(ctx, tx, k); err != nil || k != "p1" {
					return err
				}
				panic("boom")
			}
		})
		if res[0].Panicked != "boom" || res[1].Outcome != idempotent.Applied || res[2].Outcome != idempotent.Applied || res[1].Err != nil || res[2].Err != nil {
			t.Fatalf("%+v, want p1's panic and p2, p3 applied", res)
		}
		testenv.SameTx(t, res, 1, 2)
		e.wantAudit(t, []string{"p2", "p3"}, []string{"p1"})
	})
}

// TestCoalescedContextCancelled: a caller whose context ends after its
// handler ran, while the group is still running, gets its context's error,
// and its work is undone; the other message commits.
func TestCoalescedContextCancelled(t *testing.T) {
	t.Parallel()
	designs(t, testCoalescedContextCancelled)
	queuedOnlyDesigns(t, testCoalescedContextCancelled)
}

func testCoalescedContextCancelled(t *testing.T, savepoints bool) {
	e := newCoEnv(t, 4)
	m := e.mw(t, 2, savepoints)
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aRan, bHeld, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	aErr := make(chan error, 1)
	go func() {
		_, err := m.ProcessMessage(actx, idempotent.Message{Key: "a"}, func(ctx context.Context, tx pgx.Tx) error {
			defer close(aRan)
			return e.apply(ctx, tx, "a")
		})
		aErr <- err
	}()
	bRuns := 0
	var bOut idempotent.Outcome
	var bErr error
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		bOut, bErr = m.ProcessMessage(context.Background(), idempotent.Message{Key: "b"}, func(ctx context.Context, tx pgx.Tx) error {
			if bRuns++; bRuns == 1 {
				<-aRan // a's handler ran first: keys go in order
				close(bHeld)
				<-release
			}
			return e.apply(ctx, tx, "b")
		})
	}()
	<-bHeld
	cancel()
	if err := <-aErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("a got %v, want context.Canceled", err)
	}
	close(release)
	<-bDone
	if bErr != nil || bOut != idempotent.Applied || bRuns != 2 {
		t.Fatalf("b got (%v, %v) after %d runs, want applied after 2", bOut, bErr, bRuns)
	}
	e.wantAudit(t, []string{"b"}, []string{"a"})
}

// TestCoalescedDuplicates: the same keys inside one group and in groups
// running at once: one effect each.
func TestCoalescedDuplicates(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 8)
		m := e.mw(t, 4, savepoints)
		// One group: each key twice.
		res := callAll(m, []string{"e", "f", "e", "f"}, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := recordXID(ctx, tx, r); err != nil {
					return err
				}
				return e.apply(ctx, tx, k)
			}
		})
		for i := range 2 {
			if got := []idempotent.Outcome{res[i].Outcome, res[i+2].Outcome}; got[0]+got[1] != idempotent.Applied+idempotent.Duplicate || res[i].Err != nil || res[i+2].Err != nil {
				t.Fatalf("%+v, want one applied and one duplicate of each key", res)
			}
		}
		e.wantAudit(t, []string{"e", "f"}, nil)
		var keys []string
		for i := range 32 {
			keys = append(keys, fmt.Sprintf("d%d", i%4))
		}
		var runs runCounter
		res = callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				runs.add(k)
				return e.apply(ctx, tx, k)
			}
		})
		applied := map[string]int{}
		for i, r := range res {
			if r.Err != nil || r.Panicked != nil {
				t.Fatalf("%s: %+v", keys[i], r)
			}
			if r.Outcome == idempotent.Applied {
				applied[keys[i]]++
			}
		}
		if fmt.Sprint(applied) != "map[d0:1 d1:1 d2:1 d3:1]" {
			t.Errorf("applied %v, want each key once (handler runs %s)", applied, &runs)
		}
		e.wantAudit(t, []string{"d0", "d1", "d2", "d3"}, nil)
	})
}

// TestCoalescedKeyTwiceFirstFails: a key given twice in one group whose
// first handler fails: the other applies it, once.
func TestCoalescedKeyTwiceFirstFails(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		var runs atomic.Int32
		bad := errors.New("bad payload")
		res := callAll(e.mw(t, 3, savepoints), []string{"t", "t", "u"}, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := e.apply(ctx, tx, k); err != nil {
					return err
				}
				if k == "t" && runs.Add(1) == 1 {
					return bad
				}
				return nil
			}
		})
		var failed, applied int
		for _, r := range res[:2] {
			switch {
			case errors.Is(r.Err, bad):
				failed++
			case r.Err == nil && r.Outcome == idempotent.Applied:
				applied++
			}
		}
		if failed != 1 || applied != 1 || res[2].Outcome != idempotent.Applied {
			t.Fatalf("%+v, want one t failed, the other t and u applied", res)
		}
		e.wantAudit(t, []string{"t", "u"}, nil)
	})
}

// TestCoalescedLostCommit cuts the answer to a group's COMMIT, which
// landed: the group is retried on another connection, finds its claims,
// and every message is applied exactly once.
func TestCoalescedLostCommit(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		m := e.mw(t, 3, savepoints, idempgx.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
		keys := []string{"l1", "l2", "l3"}
		var armed sync.Once
		res := callAll(m, keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := recordXID(ctx, tx, r); err != nil {
					return err
				}
				armed.Do(func() { e.tap.armed.Store(true) }) // the first attempt's COMMIT is cut
				return e.apply(ctx, tx, k)
			}
		})
		for i, r := range res {
			if r.Err != nil || r.Outcome != idempotent.Duplicate {
				t.Errorf("%s: %+v, want duplicate (the lost COMMIT landed)", keys[i], r)
			}
		}
		if n := e.tap.cut.Load(); n != 1 {
			t.Fatalf("%d commits cut, want 1", n)
		}
		testenv.SameTx(t, res, 0, 1, 2)
		e.wantAudit(t, keys, nil)
	})
}

// TestCoalescedKeepsTheSinglePathsChecks: a nested call is refused, the
// pre-check answers a group's keys once committed, the lock timeout turns a
// busy claim into ErrClaimBusy for that message alone, and the retention
// fence refuses before joining.
func TestCoalescedKeepsTheSinglePathsChecks(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		lru, err := idempotent.NewSeenLRU(64)
		if err != nil {
			t.Fatal(err)
		}
		m := e.mw(t, 3, savepoints, idempgx.WithLockTimeout(100*time.Millisecond), idempgx.WithSeen(lru))
		ctx := context.Background()
		var nested error
		res := callAll(m, []string{"a", "b", "c"}, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if k == "a" {
					_, nested = m.ProcessMessage(ctx, idempotent.Message{Key: "inner"}, func(context.Context, pgx.Tx) error { return nil })
				}
				if err := recordXID(ctx, tx, r); err != nil {
					return err
				}
				return e.apply(ctx, tx, k)
			}
		})
		if !errors.Is(nested, idempgx.ErrNested) {
			t.Errorf("nested call: %v, want ErrNested", nested)
		}
		testenv.SameTx(t, res, 0, 1, 2)
		before := e.tap.writes.Load()
		res = callAll(m, []string{"a", "c"}, func(string, *coCall) idempgx.Func {
			return func(context.Context, pgx.Tx) error { return errors.New("a duplicate's handler ran") }
		})
		if res[0].Outcome != idempotent.Duplicate || res[1].Outcome != idempotent.Duplicate || e.tap.writes.Load() != before {
			t.Errorf("%+v after %d round trips, want both duplicates from the pre-check, with none", res, e.tap.writes.Load()-before)
		}
		// Another transaction holds y's claim.
		holder, err := e.p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = holder.Rollback(ctx) }()
		if _, err := holder.Exec(ctx, "INSERT INTO "+e.s+".claims (consumer, message_key) VALUES ('co', 'y')"); err != nil {
			t.Fatal(err)
		}
		res = callAll(m, []string{"x", "y", "z"}, func(k string, _ *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, k) }
		})
		if res[0].Outcome != idempotent.Applied || !errors.Is(res[1].Err, idempotent.ErrClaimBusy) || res[2].Outcome != idempotent.Applied {
			t.Fatalf("%+v, want x and z applied, y ErrClaimBusy", res)
		}
		_ = holder.Rollback(ctx)
		e.wantAudit(t, []string{"a", "b", "c", "x", "z"}, []string{"y", "inner"})
		if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "old", EventTime: time.Now().Add(-400 * 24 * time.Hour)}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Errorf("an old message: %v, want ErrBeyondRetention", err)
		}
	})
}

// TestCoalescedPartitioned: in partitioned mode a group claims each key in
// its event day's partition; a key given again with another day goes
// alone.
func TestCoalescedPartitioned(t *testing.T) {
	t.Parallel()
	designs(t, testCoalescedPartitioned)
	queuedOnlyDesigns(t, testCoalescedPartitioned)
}

func testCoalescedPartitioned(t *testing.T, savepoints bool) {
	e := newCoEnv(t, 4)
	m := e.mw(t, 3, savepoints, idempgx.WithDailyPartitions(2))
	now := time.Now()
	msgs := []idempotent.Message{{Key: "x", EventTime: now}, {Key: "x", EventTime: now.Add(-24 * time.Hour)}, {Key: "y", EventTime: now}}
	res := callMessages(m, msgs, func(msg idempotent.Message) idempgx.Func {
		return func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, msg.Key) }
	})
	for i, r := range res {
		if r.Err != nil || r.Outcome != idempotent.Applied {
			t.Errorf("message %d: %+v, want applied (a key's days are claimed apart)", i, r)
		}
	}
	if n := count(t, e.p, "SELECT count(*) FROM "+e.audit+" WHERE k = 'x'"); n != 2 {
		t.Errorf("x: %d effects, want 2 (one per day)", n)
	}
	if n := count(t, e.p, "SELECT count(*) FROM "+e.s+".claims WHERE consumer = 'co'"); n != 3 {
		t.Errorf("%d claims, want 3", n)
	}
}

// TestCoalescedPartitionedFailureKeepsOtherDays: in partitioned mode a
// message whose handler fails in a group gives back its own day's claim
// only; the claim of the same key on another day, another message's, stays,
// so a redelivery of that one is still a duplicate.
func TestCoalescedPartitionedFailureKeepsOtherDays(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		m := e.mw(t, 2, savepoints, idempgx.WithDailyPartitions(2))
		ctx := context.Background()
		yesterday := idempotent.Message{Key: "x", EventTime: time.Now().Add(-24 * time.Hour)}
		if out, err := m.ProcessMessage(ctx, yesterday, func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, "x") }); err != nil || out != idempotent.Applied {
			t.Fatalf("yesterday's x: (%v, %v), want applied", out, err)
		}
		today := []idempotent.Message{{Key: "x", EventTime: time.Now()}, {Key: "y", EventTime: time.Now()}}
		res := callMessages(m, today, func(msg idempotent.Message) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				if msg.Key == "x" {
					return errors.New("today's x fails")
				}
				return e.apply(ctx, tx, msg.Key)
			}
		})
		if res[0].Err == nil || res[1].Err != nil || res[1].Outcome != idempotent.Applied {
			t.Fatalf("today: %+v, want x failed and y applied", res)
		}
		if out, err := m.ProcessMessage(ctx, yesterday, func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, "x") }); err != nil || out != idempotent.Duplicate {
			t.Errorf("yesterday's x again: (%v, %v), want duplicate: its claim must outlive today's failure", out, err)
		}
		if n := count(t, e.p, "SELECT count(*) FROM "+e.audit+" WHERE k = 'x'"); n != 1 {
			t.Errorf("x: %d effects, want 1", n)
		}
	})
}

// TestCoalescedRoundTrips, in each exec mode: with a warm connection, a
// group of 4 new messages whose handlers send 2 statements each costs
// 4 × (1 + 2) + 1 round trips (each message's claim, the first with BEGIN
// and the fence or the lock wait bound; its handler's statements; the
// check with COMMIT) in both designs: with savepoints, each SAVEPOINT and
// the RELEASE before it ride with a claim, the last RELEASE with COMMIT.
// Without coalescing the 4 cost 4 × (1 + 2 + 1). When the handlers queue
// their statements (idempgx.Queue) instead, each message's ride with the
// next claim, the last one's with COMMIT: 4 + 1 round trips coalesced,
// 4 × 2 alone; and 2 for the group when the Middleware is made
// WithQueuedOnly (every claim with BEGIN, every effect with COMMIT).
func TestCoalescedRoundTrips(t *testing.T) {
	t.Parallel()
	inExecModes(t, func(t *testing.T, mode string) {
		for _, queued := range []bool{false, true} {
			t.Run(fmt.Sprintf("queued=%v", queued), func(t *testing.T) {
				t.Parallel()
				testCoalescedRoundTrips(t, mode, queued)
			})
		}
	})
}

func testCoalescedRoundTrips(t *testing.T, mode string, queued bool) {
	const n, stmts = 4, 2
	measure := func(t *testing.T, opts ...idempgx.Option) int64 {
		e := newCoEnv(t, 1, mode)
		e.queued = queued
		m, err := idempgx.New(e.p, "co", append([]idempgx.Option{idempgx.WithTable(e.s + ".claims")}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		var seq atomic.Int64
		group := func() {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprint("r", seq.Add(1))
			}
			res := callAll(m, keys, func(k string, _ *coCall) idempgx.Func {
				return func(ctx context.Context, tx pgx.Tx) error {
					for range stmts {
						if err := e.apply(ctx, tx, k); err != nil {
							return err
						}
					}
					return nil
				}
			})
			for _, r := range res {
				if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Fatalf("%+v", res) // on the test's goroutine: callAll waits
				}
			}
		}
		group() // warm: the connection prepares its statements once
		group()
		before := e.tap.writes.Load()
		group()
		return e.tap.writes.Load() - before
	}
	co := func(sp bool) idempgx.Option {
		return idempgx.WithCoalescing(idempotent.Coalescing{Max: n, Wait: time.Second, Savepoints: sp})
	}
	single, optimistic, savepoints := measure(t), measure(t, co(false)), measure(t, co(true))
	t.Logf("round trips for %d messages of %d statements (queued: %v): %d alone, %d coalesced, %d coalesced with savepoints", n, stmts, queued, single, optimistic, savepoints)
	var h int64 = stmts // the handler's own round trips
	if queued {
		h = 0
	}
	if single != n*(1+h+1) {
		t.Errorf("alone: %d round trips, want %d", single, n*(1+h+1))
	}
	if optimistic != n*(1+h)+1 {
		t.Errorf("coalesced: %d round trips, want %d", optimistic, n*(1+h)+1)
	}
	if savepoints != optimistic {
		t.Errorf("coalesced with savepoints: %d round trips, want %d, as many as without", savepoints, optimistic)
	}
	if !queued {
		return
	}
	// Handlers that only queue (WithQueuedOnly): the optimistic design
	// sends BEGIN, every claim, every effect and COMMIT in one round trip.
	if only := measure(t, co(false), idempgx.WithQueuedOnly()); only != 1 {
		t.Errorf("coalesced, WithQueuedOnly: %d round trips, want 1", only)
	}
}

// TestCoalescedStatementKinds: with savepoints, a group costs as many
// round trips as the optimistic design's whatever its handlers' statements
// — Exec, Query, QueryRow, SendBatch, a nested Begin, CopyFrom — since
// SAVEPOINT and RELEASE ride with the claims; and a handler of each kind
// that fails after its statement is undone alone.
func TestCoalescedStatementKinds(t *testing.T) {
	t.Parallel()
	kinds := map[string]func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error{
		"a-exec": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error { return e.apply(ctx, tx, k) },
		"b-query": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			rows, err := tx.Query(ctx, "SELECT $1::text FROM generate_series(1, 3)", k)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(got) != 3 {
				return fmt.Errorf("query: %v, %v", got, err)
			}
			return e.apply(ctx, tx, k)
		},
		"c-queryrow": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			var got string
			if err := tx.QueryRow(ctx, "SELECT $1::text", k).Scan(&got); err != nil || got != k {
				return fmt.Errorf("query row: %q, %v", got, err)
			}
			return e.apply(ctx, tx, k)
		},
		"d-batch": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO "+e.audit+" (k) VALUES ($1)", k)
			b.Queue("SELECT 1")
			return tx.SendBatch(ctx, b).Close()
		},
		"e-begin": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := e.apply(ctx, sp, k); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"f-copy": func(ctx context.Context, e *coEnv, tx pgx.Tx, k string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{e.s, "audit"}, []string{"k"}, pgx.CopyFromRows([][]any{{k}}))
			return err
		},
	}
	keys := []string{"a-exec", "b-query", "c-queryrow", "d-batch", "e-begin", "f-copy"}
	measure := func(t *testing.T, savepoints bool, keys []string) int64 {
		e := newCoEnv(t, 1)
		m := e.mw(t, len(keys), savepoints)
		var round atomic.Int32
		var applied, absent []string
		// group runs one message of each kind; the one of keys[fail], if
		// any, fails after its statement.
		group := func(fail int) {
			r := round.Add(1)
			msgs := make([]string, len(keys))
			for i, k := range keys {
				msgs[i] = fmt.Sprint(k, "/", r)
				if i == fail {
					absent = append(absent, msgs[i])
				} else {
					applied = append(applied, msgs[i])
				}
			}
			res := callAll(m, msgs, func(k string, _ *coCall) idempgx.Func {
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := kinds[strings.Split(k, "/")[0]](ctx, e, tx, k); err != nil || k != msgs[max(fail, 0)] || fail < 0 {
						return err
					}
					return errBoom
				}
			})
			for i, r := range res {
				if i == fail {
					if !errors.Is(r.Err, errBoom) {
						t.Errorf("%s: %+v, want its own error", msgs[i], r)
					}
				} else if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Errorf("%s: %+v, want applied", msgs[i], r)
				}
			}
		}
		group(-1) // warm
		before := e.tap.writes.Load()
		group(-1)
		n := e.tap.writes.Load() - before
		for fail := range keys {
			group(fail)
		}
		e.wantAudit(t, applied, absent)
		return n
	}
	if optimistic, savepoints := measure(t, false, keys), measure(t, true, keys); savepoints != optimistic {
		t.Errorf("%d round trips with savepoints, want %d, as many as without", savepoints, optimistic)
	}
}

// TestCoalescedLockWait holds a row lock outside the library and sends a
// group two messages, one of whose handlers needs that row: past
// Coalescing.LockWait that message leaves the group, the other commits
// while the lock is still held, and the first is applied alone once the
// lock goes — each exactly once, in both designs.
func TestCoalescedLockWait(t *testing.T) {
	t.Parallel()
	designs(t, func(t *testing.T, savepoints bool) {
		e := newCoEnv(t, 4)
		ctx := context.Background()
		rows := e.rows(t, 1)
		m := e.mwWith(t, idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: savepoints, LockWait: 50 * time.Millisecond})
		holder := e.hold(t, "SELECT n FROM "+rows+" WHERE id = 1 FOR UPDATE")
		var hotRuns atomic.Int32
		var hotXIDs, coldXIDs []int64 // the transactions each handler ran in
		hot, cold := make(chan coCall, 1), make(chan coCall, 1)
		go func() {
			var r coCall
			r.Outcome, r.Err = m.ProcessMessage(ctx, idempotent.Message{Key: "hot"}, func(ctx context.Context, tx pgx.Tx) error {
				hotRuns.Add(1)
				if err := recordXID(ctx, tx, &r); err != nil {
					return err
				}
				hotXIDs = append(hotXIDs, r.Tx)
				if _, err := tx.Exec(ctx, "UPDATE "+rows+" SET n = n + 1 WHERE id = 1"); err != nil {
					return err
				}
				return e.apply(ctx, tx, "hot")
			})
			hot <- r
		}()
		go func() {
			var r coCall
			r.Outcome, r.Err = m.ProcessMessage(ctx, idempotent.Message{Key: "cold"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := recordXID(ctx, tx, &r); err != nil {
					return err
				}
				coldXIDs = append(coldXIDs, r.Tx)
				return e.apply(ctx, tx, "cold")
			})
			cold <- r
		}()
		var c coCall
		select {
		case c = <-cold:
			if c.Err != nil || c.Outcome != idempotent.Applied {
				t.Fatalf("cold: %+v, want applied", c)
			}
		case r := <-hot:
			t.Fatalf("hot finished first, while its row was locked: %+v", r)
		case <-time.After(30 * time.Second):
			t.Fatal("cold did not commit while the hot row was locked: its group waited for the lock")
		}
		e.wantAudit(t, []string{"cold"}, []string{"hot"})
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-hot
		if r.Err != nil || r.Outcome != idempotent.Applied {
			t.Fatalf("hot: %+v, want applied", r)
		}
		// Optimistic, cold runs again in the group's next transaction; with
		// savepoints it runs once.
		if hotRuns.Load() != 2 || hotXIDs[0] != coldXIDs[0] || hotXIDs[1] == c.Tx || savepoints && len(coldXIDs) != 1 {
			t.Errorf("hot ran %d times in transactions %v, cold in %v; hot's first run should share cold's first transaction and its last have one of its own", hotRuns.Load(), hotXIDs, coldXIDs)
		}
		e.wantAudit(t, []string{"hot", "cold"}, nil)
		if n := count(t, e.p, "SELECT n FROM "+rows+" WHERE id = 1"); n != 1 {
			t.Fatalf("hot row n = %d, want 1", n)
		}
	})
}
