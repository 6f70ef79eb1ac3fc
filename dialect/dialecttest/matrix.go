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

// The matrix: every mode a Middleware can be configured in, on every way of
// reaching the database (a Driver: database/sql with and without
// GuardConnector, or another library's transaction type), times every
// scenario — the claim, retention and edge checks, and the mistakes a
// handler can make. It is declared once: a new mode, driver or scenario
// enters every cell.

// Mode is one way of configuring a Middleware: a row of the matrix.
type Mode struct {
	// Name names the row's subtests, such as "coalesced-precheck".
	Name string
	// Batch delivers through ProcessMessages: the messages a scenario
	// delivers at once form one batch.
	Batch bool
	// Coalesced delivers through ProcessMessage under WithCoalescing: the
	// messages a scenario delivers at once are concurrent calls that share
	// a group (Config.Group is the group's Max).
	Coalesced bool
	// Savepoints is Coalescing.Savepoints (with Coalesced).
	Savepoints bool
	// PreCheck is WithSeen, with a pre-check of the cell's own
	// (Config.Seen).
	PreCheck bool
	// StrictGuard is WithStrictGuard.
	StrictGuard bool
	// Partitioned is WithDailyPartitions: every message carries its event
	// time.
	Partitioned bool
}

// Modes returns the rows of the matrix: each mode on its own, and the
// combinations users make of coalescing with the others.
func Modes() []Mode {
	return []Mode{
		{Name: "single"},
		{Name: "batch", Batch: true},
		{Name: "coalesced", Coalesced: true},
		{Name: "savepoints", Coalesced: true, Savepoints: true},
		{Name: "precheck", PreCheck: true},
		{Name: "strict", StrictGuard: true},
		{Name: "partitioned", Partitioned: true},
		{Name: "coalesced-precheck", Coalesced: true, PreCheck: true},
		{Name: "savepoints-precheck", Coalesced: true, Savepoints: true, PreCheck: true},
		{Name: "coalesced-strict", Coalesced: true, StrictGuard: true},
		{Name: "savepoints-strict", Coalesced: true, Savepoints: true, StrictGuard: true},
		{Name: "coalesced-partitioned", Coalesced: true, Partitioned: true},
		{Name: "savepoints-partitioned", Coalesced: true, Savepoints: true, Partitioned: true},
	}
}

// Config is what a Driver's New builds a Deliverer from: the cell's table
// and consumer, its mode, and the settings its scenario needs.
type Config struct {
	// Table is the claim table, from Harness.Table.
	Table string
	// Consumer is the consumer name.
	Consumer string
	// Mode is the row of the matrix.
	Mode Mode
	// Group is Coalescing.Max when Mode.Coalesced: the scenario delivers
	// this many messages at once, so a group closes as soon as they have
	// all joined. Coalescing.Wait is CoalescingWait.
	Group int
	// LockWait is Coalescing.LockWait (0: the default).
	LockWait time.Duration
	// Seen is the pre-check when Mode.PreCheck, shared by the deliverers
	// of one cell.
	Seen idempotent.Seen
	// Clock is WithClock's clock, nil for time.Now.
	Clock func() time.Time
	// Retention is WithRetention's window, 0 for the default.
	Retention time.Duration
	// LockTimeout is WithLockTimeout's bound, 0 for none.
	LockTimeout time.Duration
	// Retry is WithRetry's policy, nil for the default.
	Retry *idempotent.RetryPolicy
}

// CoalescingWait is Coalescing.Wait in the coalesced modes: long, since a
// scenario's concurrent calls fill the group (Config.Group) and close it
// at once.
const CoalescingWait = time.Second

// Coalescing returns the Coalescing of c's mode.
func (c Config) Coalescing() idempotent.Coalescing {
	return idempotent.Coalescing{Max: c.Group, Wait: CoalescingWait, Savepoints: c.Mode.Savepoints, LockWait: c.LockWait}
}

// TableOptions returns the options describing the claim table in c:
// WithTable, WithDailyPartitions, WithRetention, WithClock and WithRetry.
func (c Config) TableOptions() []idempotent.TableOption {
	opts := []idempotent.TableOption{idempotent.WithTable(c.Table)}
	if c.Mode.Partitioned {
		opts = append(opts, idempotent.WithDailyPartitions(1))
	}
	if c.Retention > 0 {
		opts = append(opts, idempotent.WithRetention(c.Retention))
	}
	if c.Clock != nil {
		opts = append(opts, idempotent.WithClock(c.Clock))
	}
	if c.Retry != nil {
		opts = append(opts, idempotent.WithRetry(*c.Retry))
	}
	return opts
}

// Options returns the options of idempotent.New for c.
func (c Config) Options() []idempotent.Option {
	var opts []idempotent.Option
	for _, o := range c.TableOptions() {
		opts = append(opts, o)
	}
	if c.Mode.Coalesced {
		opts = append(opts, idempotent.WithCoalescing(c.Coalescing()))
	}
	if c.Mode.PreCheck {
		opts = append(opts, idempotent.WithSeen(c.Seen))
	}
	if c.Mode.StrictGuard {
		opts = append(opts, idempotent.WithStrictGuard())
	}
	if c.LockTimeout > 0 {
		opts = append(opts, idempotent.WithLockTimeout(c.LockTimeout))
	}
	return opts
}

// Deliverer is a Middleware as the matrix drives it, with handlers that
// take T, the driver's transaction type.
type Deliverer[T any] interface {
	// ProcessMessage is the Middleware's ProcessMessage.
	ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(ctx context.Context, tx T) error) (idempotent.Outcome, error)
	// ProcessMessages is the Middleware's ProcessMessages.
	ProcessMessages(ctx context.Context, msgs []idempotent.Message, fn func(ctx context.Context, tx T, fresh []int) error) ([]idempotent.Outcome, error)
	// PoolExec runs query on the Middleware's own pool with ctx, outside
	// any transaction: what a handler that writes through its *sql.DB (or
	// its pgxpool.Pool) does.
	PoolExec(ctx context.Context, query string) error
}

// Driver is a way of reaching the database under test with a transaction
// type T: database/sql (built in, see Run), or another library's (package
// idempgx runs the matrix on pgx.Tx). The scenarios are written once; the
// handler's actions on a transaction are the Driver's.
type Driver[T any] struct {
	// Name names the matrix's column, such as "plain", "guarded" or "pgx".
	Name string
	// Guarded says the connections are wrapped by
	// idempotent.GuardConnector: a handler's own Commit or Rollback, a
	// transaction-control statement, a statement the dialect commits
	// implicitly and a write through the pool with the handler's context
	// are refused with ErrAutocommit.
	Guarded bool
	// RefusesEnd says the handler's transaction refuses Commit and
	// Rollback by itself (idempgx's pgx.Tx): the matrix checks that it
	// does.
	RefusesEnd bool
	// Checked says the Middleware finds, before every COMMIT, whether the
	// transaction is still its own, whatever the mode (idempgx reads the
	// connection's transaction status). Without it only the coalesced
	// modes and the strict guard check.
	Checked bool
	// New returns a Deliverer configured as c says, its schema ensured —
	// or the constructor's error, when it refuses c.Mode or one of c's
	// settings. Required.
	New func(t testing.TB, c Config) (Deliverer[T], error)
	// Lacks returns why the driver has no way to configure m (an option
	// it does not have), or "". Such a row is skipped with the reason.
	Lacks func(m Mode) string
	// Exec runs query through tx with ctx. Required.
	Exec func(ctx context.Context, tx T, query string) error
	// QueryInt runs query, which yields one integer, through tx with ctx.
	// Required.
	QueryInt func(ctx context.Context, tx T, query string) (int64, error)
	// Commit and Rollback end tx through its own methods, as a handler
	// must not. Required.
	Commit, Rollback func(ctx context.Context, tx T) error
	// Identity returns a comparable value that is the same for the
	// handlers of one transaction and differs between transactions open
	// at the same time (a *sql.Tx itself; for pgx, its connection).
	// Required.
	Identity func(tx T) any
	// KillSession, if set, ends the database session running tx from
	// outside and returns once it is gone, as Harness.KillSession does.
	KillSession func(t testing.TB, tx T, admin *sql.DB)
}

// Exercise runs the matrix for d on the database of h: every Mode, as a
// subtest named for it, with d's column below it, and every scenario below
// that: "Matrix/<mode>/<driver>/<scenario>". A mode the dialect or the
// driver cannot support is checked to be refused by d.New (or skipped with
// d.Lacks's reason) and its scenarios are not run. Each cell runs on tables
// of its own, Harness.Concurrent cells at a time.
//
// Run calls it for database/sql, with and without GuardConnector; a library
// with its own transaction type calls it with a Driver of its own.
func Exercise[T any](t *testing.T, h Harness, d Driver[T]) {
	t.Helper()
	e := newEnv(t, h)
	if d.New == nil || d.Exec == nil || d.QueryInt == nil || d.Commit == nil || d.Rollback == nil || d.Identity == nil {
		t.Fatalf("dialecttest: Driver %q lacks one of New, Exec, QueryInt, Commit, Rollback and Identity", d.Name)
	}
	t.Run("Matrix", func(t *testing.T) { exercise(t, e, d) })
}

// newEnv checks h as Run does and returns its Env.
func newEnv(t *testing.T, h Harness) *Env {
	t.Helper()
	switch {
	case h.Dialect == nil:
		t.Fatal("dialecttest: Harness.Dialect is nil")
	case h.Open == nil:
		t.Fatal("dialecttest: Harness.Open is nil")
	case h.Table == nil:
		t.Fatal("dialecttest: Harness.Table is nil")
	}
	if h.MaxConns <= 0 {
		h.MaxConns = 34
	}
	if h.Concurrent <= 0 {
		h.Concurrent = 4
	}
	return &Env{h: h}
}

// exercise runs every mode for drivers, below t: every cell in a goroutine
// of its own, Harness.Concurrent of them at a time.
func exercise[T any](t *testing.T, e *Env, drivers ...Driver[T]) {
	sem := make(chan struct{}, e.h.Concurrent)
	fanOut(Modes(), func(m Mode) {
		t.Run(m.Name, func(t *testing.T) {
			fanOut(drivers, func(d Driver[T]) {
				t.Run(d.Name, func(t *testing.T) { exerciseMode(t, e, d, m, sem) })
			})
		})
	})
}

// fanOut calls f for every element of vs at once, and returns when every
// call has.
func fanOut[V any](vs []V, f func(V)) {
	var wg sync.WaitGroup
	for _, v := range vs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(v)
		}()
	}
	wg.Wait()
}

// exerciseMode runs one cell of every scenario of mode m on d, or checks
// the mode's refusal. A cell runs once it holds a place in sem.
func exerciseMode[T any](t *testing.T, e *Env, d Driver[T], m Mode, sem chan struct{}) {
	if d.Lacks != nil {
		if why := d.Lacks(m); why != "" {
			t.Skipf("the %s driver has no such mode: %s", d.Name, why)
		}
	}
	if why := refusal(e.h.Dialect, m); why != "" {
		t.Run("Refused", func(t *testing.T) { checkRefused(t, e, d, m, why) })
		return
	}
	var cells []scenario[T]
	if m.Coalesced && !d.Guarded {
		cells = append(cells, scenario[T]{name: "LockWaitRefused", run: func(c *cell[T]) { checkLockWaitRefusal(c.t, e, d, m) }})
	}
	for _, s := range scenarios[T]() {
		switch {
		case s.modes != nil && !s.modes(m):
		case d.Guarded && !s.guard: // the guard changes nothing here: the plain column runs it
		default:
			cells = append(cells, s)
		}
	}
	fanOut(cells, func(s scenario[T]) {
		sem <- struct{}{}
		defer func() { <-sem }()
		t.Run(s.name, func(t *testing.T) {
			c := newCell(t, e, d, m)
			if s.needs != nil {
				if why := s.needs(c); why != "" {
					t.Skip(why)
				}
			}
			s.run(c)
		})
	})
}

// refusal returns why New must refuse mode m on dialect d, naming what the
// dialect lacks, or "".
func refusal(d dialect.Dialect, m Mode) string {
	var why []string
	if m.StrictGuard && d.TxIDSQL() == "" {
		why = append(why, "WithStrictGuard: the dialect cannot identify transactions (TxIDSQL)")
	}
	if _, ok := d.(dialect.Identifier); m.PreCheck && !ok {
		why = append(why, "WithSeen: the dialect is no dialect.Identifier")
	}
	if _, ok := d.(dialect.Partitioner); m.Partitioned && !ok {
		why = append(why, "WithDailyPartitions: the dialect is no dialect.Partitioner")
	}
	return strings.Join(why, "; ")
}

// checkRefused: New refuses a mode the dialect cannot support, with an error
// naming the dialect, before anything is sent.
func checkRefused[T any](t *testing.T, e *Env, d Driver[T], m Mode, why string) {
	db := e.DB(t)
	c := Config{Table: e.Table(t, db), Consumer: "matrix", Mode: m, Group: 2}
	if m.PreCheck {
		c.Seen = newSeen(t)
	}
	_, err := d.New(t, c)
	if err == nil || !strings.Contains(err.Error(), e.h.Dialect.Name()) {
		t.Fatalf("the %s dialect cannot run the %s mode (%s), so New must refuse it naming the dialect; got %v", e.h.Dialect.Name(), m.Name, why, err)
	}
	t.Logf("refused, as expected (%s): %v", why, err)
}

// checkLockWaitRefusal: a positive Coalescing.LockWait is refused where the
// dialect's lock timeout outlives a transaction, and accepted elsewhere.
func checkLockWaitRefusal[T any](t *testing.T, e *Env, d Driver[T], m Mode) {
	db := e.DB(t)
	c := Config{Table: e.Table(t, db), Consumer: "matrix", Mode: m, Group: 2, LockWait: 100 * time.Millisecond}
	if m.PreCheck {
		c.Seen = newSeen(t)
	}
	_, err := d.New(t, c)
	_, want := c.Coalescing().LockWaitOn(e.h.Dialect)
	switch {
	case want == nil && err != nil:
		t.Fatalf("Coalescing.LockWait 100ms on the %s dialect, which can bound a group's lock waits: New = %v", e.h.Dialect.Name(), err)
	case want != nil && (err == nil || !strings.Contains(err.Error(), e.h.Dialect.Name())):
		t.Fatalf("Coalescing.LockWait 100ms on the %s dialect, which cannot bound a group's lock waits (%v): New must refuse it naming the dialect; got %v", e.h.Dialect.Name(), want, err)
	case want != nil:
		t.Logf("refused, as expected: %v", err)
	}
}

// A scenario is a column of checks, run in every mode it applies to.
type scenario[T any] struct {
	name string
	// modes reports whether the scenario applies to a mode; nil: every
	// mode.
	modes func(Mode) bool
	// guard: the guard changes what the scenario expects, so it runs on
	// the guarded column too.
	guard bool
	// needs returns why the cell cannot exist (the database cannot
	// produce the fault), or "".
	needs func(c *cell[T]) string
	run   func(c *cell[T])
}

func scenarios[T any]() []scenario[T] {
	return append(claimScenarios[T](), mistakeScenarios[T]()...)
}

// cell is one scenario in one mode on one driver: its database, tables and
// pre-check.
type cell[T any] struct {
	t     *testing.T
	e     *Env
	d     Driver[T]
	m     Mode
	db    *sql.DB // the harness's, for setup and inspection
	table string
	seen  *countingSeen
	// dl is the deliverer a mistake cell delivers through.
	dl Deliverer[T]
	// now is the cell's clock, in Unix nanoseconds: the scenarios that
	// move time give it to their middlewares (Config.Clock = c.clock).
	now atomic.Int64
}

// clock returns the cell's clock.
func (c *cell[T]) clock() time.Time { return time.Unix(0, c.now.Load()).UTC() }

// setClock sets the cell's clock.
func (c *cell[T]) setClock(t time.Time) { c.now.Store(t.UnixNano()) }

func newCell[T any](t *testing.T, e *Env, d Driver[T], m Mode) *cell[T] {
	db := e.DB(t)
	c := &cell[T]{t: t, e: e, d: d, m: m, db: db, table: e.Table(t, db)}
	c.setClock(time.Now())
	if m.PreCheck {
		c.seen = &countingSeen{inner: newSeen(t)}
	}
	return c
}

func newSeen(t testing.TB) *idempotent.SeenLRU {
	lru, err := idempotent.NewSeenLRU(1000)
	if err != nil {
		t.Fatal(err)
	}
	return lru
}

// config returns the cell's configuration for groups of n.
func (c *cell[T]) config(n int) Config {
	cfg := Config{Table: c.table, Consumer: "matrix", Mode: c.m, Group: max(n, 2)}
	if c.seen != nil {
		cfg.Seen = c.seen
	}
	if c.m.Partitioned {
		// Few days of partitions: EnsureSchema creates every day of the
		// window.
		cfg.Retention = 2 * 24 * time.Hour
	}
	return cfg
}

// deliverer returns a deliverer built from cfg, failing the cell if New
// refuses it.
func (c *cell[T]) deliverer(cfg Config) Deliverer[T] {
	c.t.Helper()
	dl, err := c.d.New(c.t, cfg)
	if err != nil {
		c.t.Fatalf("%s: New in the %s mode: %v", c.d.Name, c.m.Name, err)
	}
	return dl
}

// alone returns cfg for a deliverer of the same table, consumer and
// pre-check that does not coalesce: the redelivery of a failed message by
// another worker.
func alone(cfg Config) Config {
	cfg.Mode.Coalesced, cfg.Mode.Savepoints = false, false
	return cfg
}

// core returns a database/sql Middleware of the cell's table and consumer,
// plain (no coalescing, pre-check or strict guard), on the harness's
// database: for claims held in a transaction of the check's own.
func (c *cell[T]) core(cfg Config) *idempotent.Middleware {
	c.t.Helper()
	var opts []idempotent.Option
	for _, o := range cfg.TableOptions() {
		opts = append(opts, o)
	}
	mw, err := idempotent.New(c.db, c.e.h.Dialect, cfg.Consumer, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	return mw
}

// claimTable returns the claim table of cfg on the harness's database.
func (c *cell[T]) claimTable(cfg Config) *idempotent.ClaimTable {
	c.t.Helper()
	ct, err := idempotent.NewClaimTable(c.db, c.e.h.Dialect, cfg.TableOptions()...)
	if err != nil {
		c.t.Fatal(err)
	}
	return ct
}

// msgs returns a message per key, with an event time an hour before the
// cell's clock in partitioned mode.
func (c *cell[T]) msgs(keys ...string) []idempotent.Message {
	out := keyMessages(keys...)
	if c.m.Partitioned {
		for i := range out {
			out[i].EventTime = c.clock().Add(-time.Hour)
		}
	}
	return out
}

// result is how one delivery of a round ended.
type result struct {
	out      idempotent.Outcome
	err      error
	panicked any
	// tx is the Identity of the transaction its handler first ran in.
	tx any
}

func (r result) String() string {
	switch {
	case r.panicked != nil:
		return fmt.Sprintf("panic(%v)", r.panicked)
	case r.err != nil:
		return "error: " + r.err.Error()
	}
	return r.out.String()
}

// handler is one message's handler in a round.
type handler[T any] func(ctx context.Context, tx T) error

// round delivers msgs at once through dl — concurrent ProcessMessage calls,
// or one ProcessMessages call in batch mode, whose function runs the
// handlers of the fresh messages in order — each with its handler from h
// and its context from ctxs (nil: the round's own). It returns how each
// ended.
func (c *cell[T]) round(dl Deliverer[T], msgs []idempotent.Message, h func(i int) handler[T], ctxs []context.Context) []result {
	c.t.Helper()
	ctx := testContext(c.t)
	res := make([]result, len(msgs))
	first := func(i int, tx T) {
		if res[i].tx == nil {
			res[i].tx = c.d.Identity(tx)
		}
	}
	if c.m.Batch {
		for _, cx := range ctxs {
			if cx != nil {
				ctx = cx // the batch's caller's
			}
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					for i := range res {
						res[i].panicked = p
					}
				}
			}()
			outs, err := dl.ProcessMessages(ctx, msgs, func(ctx context.Context, tx T, fresh []int) error {
				for _, i := range fresh {
					first(i, tx)
					if err := h(i)(ctx, tx); err != nil {
						return err
					}
				}
				return nil
			})
			for i := range res {
				res[i].err = err
				if i < len(outs) {
					res[i].out = outs[i]
				}
			}
		}()
		return res
	}
	done := make(chan struct{})
	start := make(chan struct{})
	for i := range msgs {
		go func() {
			defer func() { done <- struct{}{} }()
			defer func() { res[i].panicked = recover() }()
			cx := ctx
			if ctxs != nil && ctxs[i] != nil {
				cx = ctxs[i]
			}
			<-start
			res[i].out, res[i].err = dl.ProcessMessage(cx, msgs[i], func(ctx context.Context, tx T) error {
				err := h(i)(ctx, tx)
				first(i, tx) // after its statements: Identity may send some
				return err
			})
		}()
	}
	close(start)
	for range msgs {
		<-done
	}
	return res
}

// bump returns a handler adding one to counter id through tx.
func (c *cell[T]) bump(fx *Effects, id int) handler[T] {
	return func(ctx context.Context, tx T) error { return c.d.Exec(ctx, tx, fx.BumpSQL(id)) }
}

// claims counts the cell's claims per key.
func (c *cell[T]) claims() map[string]int {
	c.t.Helper()
	n := map[string]int{}
	for _, k := range c.e.Claims(c.t, c.db, c.table) {
		n[k]++
	}
	return n
}

// sameGroup fails the cell unless, in a coalesced mode, the handler of
// message i first ran in one transaction with at least one other message's:
// a group formed, and the cell checked what it is about.
func (c *cell[T]) sameGroup(res []result, i int) {
	c.t.Helper()
	if !c.m.Coalesced || res[i].tx == nil {
		return
	}
	for j := range res {
		if j != i && res[j].tx == res[i].tx {
			return
		}
	}
	c.t.Fatalf("message %d's handler first ran alone: no group formed, so the cell did not check coalescing (results %v)", i, res)
}

// keysOf returns the keys of msgs.
func keysOf(msgs []idempotent.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Key
	}
	return out
}

// isAny reports whether err matches any of targets.
func isAny(err error, targets ...error) bool {
	return slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) })
}
