package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// The matrix's claim, retention and edge scenarios: the suite's checks of
// the claim, made of rounds of messages delivered at once, so that in the
// coalesced modes they run in groups, and in the batch mode as batches.

// claims are the modes whose claim differs from the others': the strict
// guard's only adds its reads around the claim of its mode.
func claims(m Mode) bool { return !m.StrictGuard }

// waits are the modes whose transaction waits, retries or fails
// differently: the pre-check answers only what was committed, and the
// strict guard's reads change nothing in a wait.
func waits(m Mode) bool { return !m.StrictGuard && !m.PreCheck }

func claimScenarios[T any]() []scenario[T] {
	return []scenario[T]{
		{name: "ClaimOnce", run: (*cell[T]).claimOnce},
		{name: "Duplicates", run: (*cell[T]).duplicates},
		{name: "KeysByteExact", modes: claims, run: (*cell[T]).keysByteExact},
		{name: "TakeOver/RolledBack", modes: waits, run: func(c *cell[T]) { c.takeOver(false) }},
		{name: "TakeOver/Committed", modes: waits, run: func(c *cell[T]) { c.takeOver(true) }},
		{name: "LostSession", modes: waits, needs: func(c *cell[T]) string {
			if c.d.KillSession == nil {
				return "the driver cannot kill a session (Harness.KillSession is nil)"
			}
			return ""
		}, run: (*cell[T]).lostSession},
		{name: "LockTimeout", modes: waits, run: (*cell[T]).lockTimeout},
		{name: "Horizon", modes: claims, needs: func(c *cell[T]) string {
			if c.m.Partitioned {
				return "" // the mode is refused without a Partitioner
			}
			_, cl := c.e.h.Dialect.(dialect.Cleaner)
			_, hk := c.e.h.Dialect.(dialect.HorizonKeeper)
			if !cl || !hk {
				return fmt.Sprintf("the %s dialect keeps no retention horizon (dialect.Cleaner and dialect.HorizonKeeper)", c.e.h.Dialect.Name())
			}
			return ""
		}, run: (*cell[T]).horizon},
		{name: "MissingPartition", modes: func(m Mode) bool { return m.Partitioned }, run: (*cell[T]).missingPartition},
	}
}

// want checks that res ended as want, each result an outcome or, for a
// non-nil error in errs, an error matching it.
func (c *cell[T]) want(what string, res []result, want []idempotent.Outcome, errs []error) {
	c.t.Helper()
	for i, r := range res {
		switch {
		case errs != nil && errs[i] != nil:
			if r.panicked != nil || !errors.Is(r.err, errs[i]) {
				c.t.Errorf("%s: message %d: %v; want an error matching %v", what, i, r, errs[i])
			}
		case r.panicked != nil || r.err != nil || r.out != want[i]:
			c.t.Errorf("%s: message %d: %v; want %v", what, i, r, want[i])
		}
	}
}

// each returns n copies of v.
func each[V any](n int, v V) []V {
	out := make([]V, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// claimOnce: distinct keys delivered at once all apply; delivered again, all
// are duplicates (answered by the pre-check where there is one); another
// consumer has claims of its own.
func (c *cell[T]) claimOnce() {
	const n = 4
	cfg := c.config(n)
	dl := c.deliverer(cfg)
	fx := c.e.NewEffects(c.t, c.db, c.table, n)
	msgs := c.msgs("a", "b", "c", "d")
	h := func(i int) handler[T] { return c.bump(fx, i+1) }
	res := c.round(dl, msgs, h, nil)
	c.want("first delivery", res, each(n, idempotent.Applied), nil)
	c.sameGroup(res, 0)
	var hits int32
	if c.seen != nil {
		hits = c.seen.hits.Load()
	}
	c.want("redelivery", c.round(dl, msgs, h, nil), each(n, idempotent.Duplicate), nil)
	if c.seen != nil {
		if got := c.seen.hits.Load() - hits; got != n {
			c.t.Errorf("the pre-check answered %d of the %d redeliveries, want all", got, n)
		}
	}
	other := cfg
	other.Consumer = "matrix-other"
	if c.seen != nil {
		other.Seen = newSeen(c.t)
	}
	c.want("another consumer", c.round(c.deliverer(other), msgs, h, nil), each(n, idempotent.Applied), nil)
	for i := range n {
		if got := fx.Get(c.t, i+1); got != 2 {
			c.t.Errorf("message %d: effect %d after two consumers, want 2", i, got)
		}
	}
	if got := c.e.Claims(c.t, c.db, c.table); len(got) != 2*n {
		c.t.Errorf("claims %q, want %d", got, 2*n)
	}
}

// duplicates: copies of two keys delivered at once — in one group, in one
// batch — apply each key once: one Applied per key, the rest Duplicate.
func (c *cell[T]) duplicates() {
	const n = 6
	dl := c.deliverer(c.config(n))
	fx := c.e.NewEffects(c.t, c.db, c.table, 2)
	msgs := c.msgs("x", "x", "x", "y", "y", "y")
	h := func(i int) handler[T] { return c.bump(fx, 1+i/3) }
	for round := range 2 {
		res := c.round(dl, msgs, h, nil)
		applied := map[string]int{}
		for i, r := range res {
			switch {
			case r.err != nil || r.panicked != nil:
				c.t.Errorf("round %d, message %d (%s): %v", round+1, i, msgs[i].Key, r)
			case r.out == idempotent.Applied:
				applied[msgs[i].Key]++
			}
		}
		want := map[string]int{"x": 1, "y": 1}
		if round > 0 {
			want = map[string]int{}
		}
		if fmt.Sprint(applied) != fmt.Sprint(want) {
			c.t.Errorf("round %d: applied %v, want %v (the others duplicates): %v", round+1, applied, want, res)
		}
	}
	for id := 1; id <= 2; id++ {
		if got := fx.Get(c.t, id); got != 1 {
			c.t.Errorf("key %d: effect %d, want 1", id, got)
		}
	}
}

// keysByteExact: keys that a case-, accent- or pad-insensitive comparison
// would equate are claimed as their own, and stored unchanged, by the
// claim statement of every mode (the batch claim's array, the partitioned
// claim's).
func (c *cell[T]) keysByteExact() {
	const n = 6
	dl := c.deliverer(c.config(n))
	max := c.e.h.Dialect.MaxKeyBytes()
	keys := []string{
		"A", "a", "x", "x ", " x", "é", "e\u0301", "ß", "ss", "İ", "i",
		"tab\tkey", "line\nkey", "quote'key", `back\slash`, "😀",
		strings.Repeat("k", max),
		strings.Repeat("é", max/2) + strings.Repeat("k", max%2),
	}
	nop := func(int) handler[T] { return func(context.Context, T) error { return nil } }
	for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		for j := 0; j < len(keys); j += n {
			ks := keys[j:min(j+n, len(keys))]
			res := c.round(dl, c.msgs(ks...), nop, nil)
			for i, r := range res {
				if r.err != nil || r.panicked != nil || r.out != want {
					c.t.Errorf("key %s = %v, want %v", short(ks[i]), r, want)
				}
			}
		}
	}
	got := c.e.Claims(c.t, c.db, c.table)
	wantKeys := slices.Clone(keys)
	slices.Sort(wantKeys)
	slices.Sort(got)
	if !slices.Equal(got, wantKeys) {
		c.t.Errorf("stored keys differ from the keys claimed (lost, altered or padded):\n got %s\nwant %s", shortAll(got), shortAll(wantKeys))
	}
}

// takeOver: a claim held in a transaction of its own while a round
// including its key waits; when the holder rolls back, the round's
// delivery of the key applies; when it commits, it is a duplicate. The
// round's other messages apply either way.
func (c *cell[T]) takeOver(commit bool) {
	const n = 3
	ctx := testContext(c.t)
	cfg := c.config(n)
	dl := c.deliverer(cfg)
	fx := c.e.NewEffects(c.t, c.db, c.table, n)
	msgs := c.msgs("k", "o1", "o2")
	holder := c.hold(cfg, msgs[0])
	if err := fx.Bump(ctx, holder, 1); err != nil {
		c.t.Fatal(err)
	}
	done := make(chan []result, 1)
	go func() { done <- c.round(dl, msgs, func(i int) handler[T] { return c.bump(fx, i+1) }, nil) }()
	select {
	case res := <-done:
		c.t.Fatalf("the round did not wait for the holder of k: %v", res)
	case <-time.After(waitBeforeRelease):
	}
	end := holder.Rollback
	if commit {
		end = holder.Commit
	}
	if err := end(); err != nil {
		c.t.Fatal(err)
	}
	res := <-done
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Applied}
	if commit {
		want[0] = idempotent.Duplicate
	}
	c.want("the round behind the holder", res, want, nil)
	for i := range n {
		if got := fx.Get(c.t, i+1); got != 1 {
			c.t.Errorf("message %d: effect %d, want exactly 1", i, got)
		}
	}
}

// hold claims msg in a transaction of the check's own, rolled back at the
// end of the cell if it is still open.
func (c *cell[T]) hold(cfg Config, msg idempotent.Message) *sql.Tx {
	c.t.Helper()
	ctx := testContext(c.t)
	holder, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = holder.Rollback() })
	if claimed, err := c.core(cfg).ClaimMessage(ctx, holder, msg); err != nil || !claimed {
		c.t.Fatalf("the holder's ClaimMessage = %v, %v", claimed, err)
	}
	return holder
}

// lostSession: the session running a round's transaction is killed from
// outside in a handler; the transaction (the group's) is retried on
// another connection and every message applies once.
func (c *cell[T]) lostSession() {
	const n = 3
	dl := c.deliverer(c.config(n))
	fx := c.e.NewEffects(c.t, c.db, c.table, n)
	admin := c.e.DB(c.t)
	var killed bool
	h := func(i int) handler[T] {
		return func(ctx context.Context, tx T) error {
			if err := c.d.Exec(ctx, tx, fx.BumpSQL(i+1)); err != nil {
				return err
			}
			if i == 1 && !killed {
				killed = true // only message 1's handler reads it, one attempt at a time
				c.d.KillSession(c.t, tx, admin)
			}
			return nil
		}
	}
	res := c.round(dl, c.msgs("a", "b", "c"), h, nil)
	c.want("deliveries around a killed session", res, each(n, idempotent.Applied), nil)
	for i := range n {
		if got := fx.Get(c.t, i+1); got != 1 {
			c.t.Errorf("message %d: effect %d, want 1", i, got)
		}
	}
}

// lockTimeout: with WithLockTimeout, the delivery of a key another
// transaction holds fails with ErrClaimBusy, its handler not run, while the
// round's other messages apply; once the holder rolled back it applies. A
// dialect that cannot bound lock waits has New refuse the option.
func (c *cell[T]) lockTimeout() {
	const n = 3
	cfg := c.config(n)
	cfg.LockTimeout = 200 * time.Millisecond
	if c.e.h.Dialect.LockTimeoutSQL(cfg.LockTimeout) == "" {
		_, err := c.d.New(c.t, cfg)
		if err == nil || !strings.Contains(err.Error(), c.e.h.Dialect.Name()) {
			c.t.Fatalf("the dialect cannot bound lock waits, so New(WithLockTimeout) must fail naming it; got %v", err)
		}
		c.t.Logf("refused, as expected: %v", err)
		return
	}
	dl := c.deliverer(cfg)
	fx := c.e.NewEffects(c.t, c.db, c.table, n)
	msgs := c.msgs("held", "o1", "o2")
	holder := c.hold(cfg, msgs[0])
	ran := false
	h := func(i int) handler[T] {
		return func(ctx context.Context, tx T) error {
			if i == 0 {
				ran = true
			}
			return c.d.Exec(ctx, tx, fx.BumpSQL(i+1))
		}
	}
	res := c.round(dl, msgs, h, nil)
	if c.m.Batch {
		// The batch claims its keys in one statement: the busy key fails
		// the batch.
		c.want("a batch with a held key", res, nil, each[error](n, idempotent.ErrClaimBusy))
	} else {
		c.want("a round with a held key", res, []idempotent.Outcome{0, idempotent.Applied, idempotent.Applied}, []error{idempotent.ErrClaimBusy, nil, nil})
	}
	if ran {
		c.t.Error("the handler of the held key ran although its claim timed out")
	}
	if err := holder.Rollback(); err != nil {
		c.t.Fatal(err)
	}
	c.settle(alone(cfg), msgs, res, h)
	c.exactlyOnce(fx, msgs)
}

// horizon: claims another process's cleanup has forgotten (a shorter
// window: Cleanup deleted them and raised the retention horizon; in
// partitioned mode MaintainPartitions dropped their day) refuse their
// replays with ErrBeyondRetention in every mode, while the round's new
// messages apply.
func (c *cell[T]) horizon() {
	const n = 4
	ctx := testContext(c.t)
	cfg := c.config(n)
	fx := c.e.NewEffects(c.t, c.db, c.table, n+2)
	old := c.msgs("old1", "old2", "kept1", "kept2")
	var later time.Time
	var forget func()
	if c.m.Partitioned {
		// Days, on a clock of the cell's own: the claims are made on day
		// D-1 (and D) at D 12:00; a day later a cleaner with a one-day
		// window drops day D-1, which the deliverer's two-day window
		// still accepts.
		day := time.Date(2031, 3, 14, 0, 0, 0, 0, time.UTC)
		c.setClock(day.Add(12 * time.Hour))
		cfg.Clock = c.clock
		for i := range old {
			old[i].EventTime = day.Add(-11 * time.Hour) // D-1 13:00
			if i >= 2 {
				old[i].EventTime = day.Add(11 * time.Hour) // D 11:00
			}
		}
		later = day.Add(24*time.Hour + 11*time.Hour) // D+1 11:00
		forget = func() {
			c.setClock(day.Add(36 * time.Hour))
			cleaner := cfg
			cleaner.Retention = 24 * time.Hour
			rep, err := c.claimTable(cleaner).MaintainPartitions(ctx)
			if err != nil {
				c.t.Fatalf("MaintainPartitions with a one-day window: %v", err)
			}
			c.t.Logf("MaintainPartitions dropped %v", rep.Dropped)
		}
	} else {
		// A clock of the cell's own, ten days ahead of the database's,
		// which stamps processed_at: a cleaner a day and five minutes
		// further ahead, with a one-day window, deletes every claim and
		// raises the horizon to the cell's clock; ten minutes later new
		// messages are past the horizon and the clock-skew margin, the
		// replays not.
		c.setClock(time.Now().Add(10 * 24 * time.Hour))
		cfg.Clock = c.clock
		for i := range old {
			old[i].EventTime = c.clock().Add(-time.Hour)
		}
		forget = func() {
			cleaner := cfg
			cleaner.Retention = 24 * time.Hour
			at := c.clock().Add(24*time.Hour + idempotent.DefaultClockSkew)
			cleaner.Clock = func() time.Time { return at }
			if _, err := c.claimTable(cleaner).Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil {
				c.t.Fatalf("Cleanup with a one-day window: %v", err)
			}
			c.setClock(c.clock().Add(10 * time.Minute))
			later = c.clock()
		}
	}
	dl := c.deliverer(cfg)
	h := func(i int) handler[T] { return c.bump(fx, i+1) }
	c.want("first delivery", c.round(dl, old, h, nil), each(n, idempotent.Applied), nil)
	forget()
	c.t.Logf("horizons: %s", c.horizons(cfg))
	replay := []idempotent.Message{old[0], old[1], {Key: "new1", EventTime: later}, {Key: "new2", EventTime: later}}
	res := c.round(dl, replay, func(i int) handler[T] {
		if i < 2 {
			return c.bump(fx, i+1)
		}
		return c.bump(fx, n+i-1)
	}, nil)
	switch {
	case c.m.Batch:
		// The horizon refuses the batch at the claim, naming the message.
		for i, r := range res {
			if !errors.Is(r.err, idempotent.ErrBeyondRetention) {
				c.t.Errorf("a batch with forgotten messages: message %d: %v; want ErrBeyondRetention", i, r)
			}
		}
	case c.m.PreCheck:
		// The pre-check still remembers them: duplicates, which they are.
		c.want("replays of forgotten messages among new ones", res,
			[]idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Applied, idempotent.Applied}, nil)
	default:
		c.want("replays of forgotten messages among new ones", res,
			[]idempotent.Outcome{0, 0, idempotent.Applied, idempotent.Applied},
			[]error{idempotent.ErrBeyondRetention, idempotent.ErrBeyondRetention, nil, nil})
	}
	for i := range 2 {
		if got := fx.Get(c.t, i+1); got != 1 {
			c.t.Errorf("%s: effect %d after its replay, want 1 (applied once, before it was forgotten)", old[i].Key, got)
		}
	}
}

// horizons lists the claim table's horizons, for the log.
func (c *cell[T]) horizons(cfg Config) string {
	hs, err := c.claimTable(cfg).Horizons(testContext(c.t))
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(hs)
}

// missingPartition: a message of a day whose partition does not exist yet
// fails with ErrNoPartition, alone: the round's other messages apply; once
// MaintainPartitions created the day, it applies.
func (c *cell[T]) missingPartition() {
	const n = 3
	ctx := testContext(c.t)
	day := time.Date(2031, 3, 14, 0, 0, 0, 0, time.UTC)
	c.setClock(day.Add(12 * time.Hour))
	cfg := c.config(n)
	cfg.Clock = c.clock
	dl := c.deliverer(cfg) // partitions up to D+1
	fx := c.e.NewEffects(c.t, c.db, c.table, n)
	c.setClock(day.Add(2*24*time.Hour + 12*time.Hour))
	msgs := []idempotent.Message{
		{Key: "p1", EventTime: day.Add(24*time.Hour + time.Hour)},
		{Key: "q", EventTime: day.Add(2*24*time.Hour + time.Hour)}, // D+2: not created
		{Key: "p2", EventTime: day.Add(24*time.Hour + time.Hour)},
	}
	h := func(i int) handler[T] { return c.bump(fx, i+1) }
	res := c.round(dl, msgs, h, nil)
	if c.m.Batch {
		c.want("a batch with a message of a day not created yet", res, nil, each[error](n, idempotent.ErrNoPartition))
	} else {
		c.want("a round with a message of a day not created yet", res,
			[]idempotent.Outcome{idempotent.Applied, 0, idempotent.Applied}, []error{nil, idempotent.ErrNoPartition, nil})
	}
	for _, r := range res {
		if errors.Is(r.err, idempotent.ErrBeyondRetention) {
			c.t.Errorf("a day inside the window without its partition is not beyond retention: %v", r)
		}
	}
	if _, err := c.claimTable(cfg).MaintainPartitions(ctx); err != nil {
		c.t.Fatal(err)
	}
	c.settle(alone(cfg), msgs, res, h)
	c.exactlyOnce(fx, msgs)
}

// settle redelivers every message of msgs whose delivery in res failed,
// through a deliverer of cfg, with the well-behaved handlers h, until each
// ends without an error (three tries at most), as a broker redelivers.
func (c *cell[T]) settle(cfg Config, msgs []idempotent.Message, res []result, h func(i int) handler[T]) {
	c.t.Helper()
	var failed []int
	for i, r := range res {
		if r.err != nil || r.panicked != nil {
			failed = append(failed, i)
		}
	}
	if len(failed) == 0 {
		return
	}
	dl := c.deliverer(cfg)
	ctx := testContext(c.t)
	for try := 1; len(failed) > 0; try++ {
		if try > 3 {
			c.t.Fatalf("messages %v still fail after 3 redeliveries", failed)
		}
		var again []int
		if c.m.Batch {
			batch := make([]idempotent.Message, len(failed))
			for j, i := range failed {
				batch[j] = msgs[i]
			}
			_, err := dl.ProcessMessages(ctx, batch, func(ctx context.Context, tx T, fresh []int) error {
				for _, j := range fresh {
					if err := h(failed[j])(ctx, tx); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				c.t.Logf("redelivery %d of the batch %v: %v", try, failed, err)
				again = failed
			}
		} else {
			for _, i := range failed {
				if _, err := dl.ProcessMessage(ctx, msgs[i], h(i)); err != nil {
					c.t.Logf("redelivery %d of message %d: %v", try, i, err)
					again = append(again, i)
				}
			}
		}
		failed = again
	}
}

// exactlyOnce checks that every message's effect (counter i+1) is 1 and
// that it has one claim.
func (c *cell[T]) exactlyOnce(fx *Effects, msgs []idempotent.Message) {
	c.t.Helper()
	claims := c.claims()
	for i, m := range msgs {
		if got, n := fx.Get(c.t, i+1), claims[m.Key]; got != 1 || n != 1 {
			c.t.Errorf("message %d (%s) after redelivery: effect %d, claims %d; want exactly one of each", i, m.Key, got, n)
		}
	}
}
