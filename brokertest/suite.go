package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
)

// suite is one Run in one mode: the harness, the database, and the mode.
type suite struct {
	h     Harness
	f     Features
	db    *sql.DB
	mode  mode
	batch bool
}

// scenario is one check of the suite.
type scenario struct {
	name string
	// core scenarios run in every mode; the others in the per-message
	// and batch modes only.
	core bool
	// needs returns why the scenario does not apply, or "".
	needs func(f Features, batch bool) string
	run   func(e *suite, t *testing.T)
}

// Mode names a way the suite runs its scenarios: a consumer mode and the
// Middleware's options.
type Mode string

// The suite's modes. PerMessage and Batch run every scenario; the others
// run the core scenarios (redelivery, lost ack, handler error, concurrent
// duplicates, poison, the database's faults and the handler's mistakes)
// with four workers, per message.
const (
	// PerMessage: the adapter's per-message consumer, one worker.
	PerMessage Mode = "per-message"
	// Batch: the adapter's batch consumer (Features.Batch).
	Batch Mode = "batch"
	// Coalesced: idempotent.WithCoalescing, the optimistic design.
	Coalesced Mode = "coalesced"
	// CoalescedSavepoints: idempotent.WithCoalescing with Savepoints.
	CoalescedSavepoints Mode = "coalesced-savepoints"
	// PreCheck: the duplicate pre-check, idempotent.WithSeen over an
	// idempotent.SeenLRU of the scenario's own.
	PreCheck Mode = "precheck"
)

// mode is how a Mode runs: the consumer kind, its workers, and the
// Middleware's options for each scenario.
type mode struct {
	name    Mode
	batch   bool
	all     bool // every scenario, not only the core ones
	workers int
	opts    func() ([]idempotent.Option, error)
}

// coalescing is the grouping of the coalesced modes: groups of up to four,
// held open briefly so that the four workers' messages meet.
var coalescing = idempotent.Coalescing{Max: 4, Wait: 5 * time.Millisecond}

// modes returns the suite's modes for features f.
func modes(f Features) []mode {
	none := func() ([]idempotent.Option, error) { return nil, nil }
	ms := []mode{{name: PerMessage, all: true, workers: 1, opts: none}}
	if f.Batch {
		ms = append(ms, mode{name: Batch, batch: true, all: true, workers: 1, opts: none})
	}
	savepoints := coalescing
	savepoints.Savepoints = true
	return append(ms,
		mode{name: Coalesced, workers: 4, opts: func() ([]idempotent.Option, error) {
			return []idempotent.Option{idempotent.WithCoalescing(coalescing)}, nil
		}},
		mode{name: CoalescedSavepoints, workers: 4, opts: func() ([]idempotent.Option, error) {
			return []idempotent.Option{idempotent.WithCoalescing(savepoints)}, nil
		}},
		mode{name: PreCheck, workers: 4, opts: func() ([]idempotent.Option, error) {
			lru, err := idempotent.NewSeenLRU(1024)
			return []idempotent.Option{idempotent.WithSeen(lru)}, err
		}},
	)
}

// Run runs the conformance suite on the adapter h tests, as subtests of t:
// "<mode>/<scenario>" for each [Mode] (Batch when Features.Batch). A mode
// in Features.Refuses runs no scenario: the suite checks the adapter's
// NewConsumer refuses it. The database is the test Postgres
// (IDEMPOTENT_POSTGRES_DSN, default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), opened with
// idempotent.OpenGuarded; without it the suite skips, or fails when the CI
// environment variable is set. Every scenario creates a schema of its own
// and drops it at the end. Scenarios run one at a time: a broker's ack
// deadline must not pass while a loaded machine runs several.
func Run(t *testing.T, h Harness) {
	t.Helper()
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	db, err := idempotent.OpenGuarded("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, "brokertest: no Postgres at %s: %v", dsn, err)
	}
	db.SetMaxOpenConns(16)
	f := h.Features()
	if f.DeadLetter {
		t.Log("poison is dead-lettered")
	} else {
		t.Log("poison is terminated")
	}
	all := append(append(append(scenarios[:len(scenarios):len(scenarios)], faultScenarios...), mistakeScenarios()...), orderedScenarios...)
	for _, m := range modes(f) {
		s := &suite{h: h, f: f, db: db, mode: m, batch: m.batch}
		t.Run(string(m.name), func(t *testing.T) {
			if slices.Contains(f.Refuses, m.name) {
				s.refused(t)
				return
			}
			for _, sc := range all {
				if !m.all && !sc.core {
					continue
				}
				t.Run(sc.name, func(t *testing.T) {
					if sc.needs != nil {
						if why := sc.needs(f, m.batch); why != "" {
							t.Skip(why)
						}
					}
					sc.run(s, t)
				})
			}
		})
	}
}

// refused checks the adapter refuses the suite's mode at construction: its
// NewConsumer returns an error for a Middleware with the mode's options.
func (s *suite) refused(t *testing.T) {
	e := s.newEnv(t)
	cfg := e.config()
	cfg.Observer = adapter.ObserverFunc(func(context.Context, adapter.Event) {})
	c, err := e.tr.NewConsumer(cfg)
	if err == nil {
		_ = c.Stop(context.Background())
		t.Fatalf("mode %s is in Features.Refuses, but NewConsumer accepted it", s.mode.name)
	}
	t.Logf("refused: %v", err)
}

var errFailOnce = errors.New("brokertest: the handler fails half-way on its first attempt")

// perMessage is a needs for scenarios about a consumer's life rather
// than its mode.
func perMessage(_ Features, batch bool) string {
	if batch {
		return "run in per-message mode only"
	}
	return ""
}

var scenarios = []scenario{
	{name: "Redelivery", core: true, run: func(s *suite, t *testing.T) {
		// The same key sent twice (a redelivery, a re-send): one effect.
		e := s.newEnv(t)
		e.ensureSchema()
		o := newOrder(1)
		at := time.Now().Add(-time.Minute)
		e.publish(o, at, time.Time{}, nil)
		e.publish(o, at, time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 2)
		e.stopAll()
		e.want(o.Key(), 1, 1)
		e.audit(o)
		e.atBroker()
	}},
	{name: "CrashAfterCommit", core: true, needs: func(f Features, _ bool) string {
		if !f.LoseAck {
			return "the harness cannot lose an ack after commit (Features.LoseAck)"
		}
		return ""
	}, run: func(s *suite, t *testing.T) {
		// The first ack is lost after the commit: the redelivery is a
		// Duplicate, one effect.
		e := s.newEnv(t)
		e.ensureSchema()
		o := newOrder(2)
		cfg := e.config()
		lost := false
		cfg.LoseAck = func(key string) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			if key != o.Key() || lost {
				return false
			}
			lost = true
			return true
		}
		e.publish(o, time.Now(), time.Time{}, nil)
		e.start(cfg)
		e.waitSettled(o.Key(), adapter.Ack, 2)
		e.stopAll()
		e.want(o.Key(), 1, 1)
		e.audit(o)
		e.atBroker()
	}},
	{name: "HandlerErrorThenSuccess", core: true, run: func(s *suite, t *testing.T) {
		// The handler writes the balance, then fails, on the first
		// attempt: requeued, then applied once, balance exact.
		e := s.newEnv(t)
		e.ensureSchema()
		o := newOrder(3)
		var failed atomic.Bool
		e.setHook(func(context.Context, *sql.Tx, order) error {
			if failed.Swap(true) {
				return nil
			}
			return errFailOnce
		})
		e.publish(o, time.Now(), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.stopAll()
		rq := e.rec.of(o.Key(), adapter.Requeue, 0)
		if len(rq) == 0 || !errors.Is(rq[0].Err, errFailOnce) {
			t.Errorf("requeues %+v, want the handler's error first", rq)
		}
		if p := e.rec.of(o.Key(), adapter.DeadLetter, 0); len(p) != 0 {
			t.Errorf("poisoned %+v", p)
		}
		e.want(o.Key(), 1, 0)
		e.audit(o)
		e.atBroker()
	}},
	{name: "ConcurrentDuplicates", core: true, run: func(s *suite, t *testing.T) {
		// Eight copies of one key, four workers: one effect, seven
		// duplicates, eight acks.
		e := s.newEnv(t)
		e.ensureSchema()
		o := newOrder(4)
		at := time.Now()
		for range 8 {
			e.publish(o, at, time.Time{}, nil)
		}
		cfg := e.config()
		cfg.Workers = 4
		e.start(cfg)
		e.waitSettled(o.Key(), adapter.Ack, 8)
		e.stopAll()
		e.want(o.Key(), 1, 7)
		e.audit(o)
		e.atBroker()
	}},
	{name: "PoisonHeader", core: true, run: func(s *suite, t *testing.T) {
		// An event-time header that is not RFC 3339 is poison exactly
		// once, nothing written; the good message beside it and its
		// duplicate settle on their own.
		e := s.newEnv(t)
		e.ensureSchema()
		bad, good := newOrder(5), newOrder(6)
		e.publish(bad, time.Time{}, time.Time{}, map[string]string{adapter.EventTimeHeader: "1767225600"})
		e.publish(good, time.Now(), time.Time{}, nil)
		e.publish(good, time.Now(), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(bad.Key(), adapter.DeadLetter, 1)
		e.waitSettled(good.Key(), adapter.Ack, 2)
		e.stopAll()
		wantOnlyPoison(t, e, bad.Key(), adapter.ErrBadEventTime)
		e.want(good.Key(), 1, 1)
		e.audit(good)
		e.atBroker()
	}},
	{name: "PreCheck", run: func(s *suite, t *testing.T) {
		// With the duplicate pre-check on (idempotent.WithSeen), a
		// redelivery of an applied message is a Duplicate, and one whose
		// first attempt failed is not taken as seen: each is applied
		// exactly once, whichever copy comes first.
		lru, err := idempotent.NewSeenLRU(1024)
		if err != nil {
			t.Fatal(err)
		}
		e := s.newEnv(t, idempotent.WithSeen(lru))
		e.ensureSchema()
		o, p := newOrder(30), newOrder(31)
		var failed atomic.Bool
		e.setHook(func(_ context.Context, _ *sql.Tx, got order) error {
			if got.Key() != p.Key() || failed.Swap(true) {
				return nil
			}
			return errFailOnce
		})
		at := time.Now().Add(-time.Minute)
		for range 2 {
			e.publish(o, at, time.Time{}, nil)
			e.publish(p, at, time.Time{}, nil)
		}
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 2)
		e.waitSettled(p.Key(), adapter.Ack, 2)
		e.stopAll()
		if !failed.Load() {
			t.Errorf("the handler of %s never failed", p.Key())
		}
		e.want(o.Key(), 1, 1)
		e.want(p.Key(), 1, 1)
		e.audit(o, p)
		e.atBroker()
	}},
	{name: "Partitioned/RefusedWithoutEventTime", run: func(s *suite, t *testing.T) {
		// A consumer that reads no producer event time is refused at
		// construction on a partitioned table — never a terminated
		// message later; the default (the header) is accepted.
		e := s.newEnv(t, idempotent.WithDailyPartitions(1), idempotent.WithRetention(48*time.Hour))
		cfg := e.config()
		cfg.Observer = adapter.ObserverFunc(func(context.Context, adapter.Event) {})
		if _, err := e.tr.NewConsumer(cfg); err != nil {
			t.Fatalf("partitioned, the default event time: %v", err)
		}
		cfg.NoEventTime = true
		_, err := e.tr.NewConsumer(cfg)
		if !errors.Is(err, adapter.ErrNoProducerEventTime) {
			t.Fatalf("partitioned, no event time: %v, want adapter.ErrNoProducerEventTime", err)
		}
		t.Logf("refused: %v", err)
	}},
	{name: "Partitioned/ResendAcrossMidnight", run: func(s *suite, t *testing.T) {
		// Produced at 23:30, re-sent at 00:30 the next day with a later
		// transport time but the same header: one partition, Duplicate.
		e := s.newEnv(t, idempotent.WithDailyPartitions(1), idempotent.WithRetention(72*time.Hour))
		now := time.Date(2031, 3, 15, 0, 30, 0, 0, time.UTC)
		e.clock.Set(now)
		e.ensureSchema()
		o := newOrder(7)
		produced := now.Add(-time.Hour)
		e.publish(o, produced, produced, nil)
		e.publish(o, produced, now, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 2)
		e.stopAll()
		e.want(o.Key(), 1, 1)
		e.audit(o)
		e.atBroker()
		day := testenv.Count(t, s.db, e.schema, "SELECT count(*) FROM $S.processed_messages WHERE event_day = DATE '2031-03-14'")
		if day != 1 {
			t.Errorf("%d claims on 2031-03-14, want 1: the claim belongs to the event's day", day)
		}
	}},
	{name: "TooOld", run: func(s *suite, t *testing.T) {
		// An event older than the retention window is poison
		// (ErrBeyondRetention), nothing written.
		e := s.newEnv(t, idempotent.WithRetention(48*time.Hour))
		now := time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC)
		e.clock.Set(now)
		e.ensureSchema()
		old, fresh := newOrder(8), newOrder(9)
		e.publish(old, now.Add(-72*time.Hour), time.Time{}, nil)
		e.publish(fresh, now.Add(-time.Hour), time.Time{}, nil)
		e.poisonBeside(old, fresh, idempotent.ErrBeyondRetention)
	}},
	{name: "FutureDated", run: func(s *suite, t *testing.T) {
		// Dated beyond the adapter's default future bound past the clock
		// and its skew margin (adapter.DefaultFutureBound; the skew margin
		// itself on an ordered transport): poison once. Within it:
		// requeued until the clock catches up (the suite checks the
		// settlement, it does not wait for the clock). Nothing written.
		e := s.newEnv(t)
		now := time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC)
		e.clock.Set(now)
		e.ensureSchema()
		far, soon := newOrder(10), newOrder(11)
		skew := e.mw.Config().ClockSkew
		bound := adapter.DefaultFutureBound
		if s.f.Ordered {
			bound = skew
		}
		e.publish(far, now.Add(skew+bound+time.Minute), time.Time{}, nil)
		e.publish(soon, now.Add(skew+bound/2), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(far.Key(), adapter.DeadLetter, 1)
		e.waitSettled(soon.Key(), adapter.Requeue, 1)
		e.stopAll()
		wantOnlyPoison(t, e, far.Key(), idempotent.ErrInvalidEventTime)
		for _, st := range e.rec.of(soon.Key(), 0, 0) {
			if released(st) {
				continue
			}
			if st.Action != adapter.Requeue || !errors.Is(st.Err, idempotent.ErrInvalidEventTime) {
				t.Errorf("within the bound: %v (%v), want requeue with ErrInvalidEventTime", st.Action, st.Err)
			}
			if s.f.RequeueDelay && st.Delay < bound/2 {
				t.Errorf("within the bound: requeued after %v, want at least %v (until the clock catches up)", st.Delay, bound/2)
			}
		}
		e.audit()
	}},
	{name: "GracefulShutdownMidHandler", needs: perMessage, run: func(s *suite, t *testing.T) {
		// Stop while a handler runs: the in-flight message is finished
		// (or redelivered to the next consumer) and applied once; a
		// message published meanwhile is not lost.
		e := s.newEnv(t)
		e.ensureSchema()
		inFlight, later := newOrder(12), newOrder(13)
		entered, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		e.setHook(func(ctx context.Context, _ *sql.Tx, o order) error {
			if o.OrderID != inFlight.OrderID || once.Swap(true) {
				return nil
			}
			close(entered)
			<-release
			return nil
		})
		e.publish(inFlight, time.Now(), time.Time{}, nil)
		c := e.start(e.config())
		<-entered
		stopping, stopped := make(chan struct{}), make(chan error, 1)
		go func() {
			close(stopping)
			ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
			defer cancel()
			stopped <- c.Stop(ctx)
		}()
		<-stopping
		if s.f.Restart {
			e.publish(later, time.Now(), time.Time{}, nil)
		}
		close(release)
		if err := <-stopped; err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if !s.f.Restart {
			if len(e.rec.of(inFlight.Key(), adapter.Ack, 1)) != 1 {
				t.Fatalf("the in-flight message was not acked by the stopping consumer: %+v", e.rec.of(inFlight.Key(), 0, 0))
			}
			e.want(inFlight.Key(), 1, 0)
			e.audit(inFlight)
			return
		}
		e.start(e.config())
		e.waitSettled(inFlight.Key(), adapter.Ack, 1)
		e.waitSettled(later.Key(), adapter.Ack, 1)
		e.stopAll()
		// A transport that replays to a new subscriber may deliver
		// either again: duplicates, applied once.
		for _, o := range []order{inFlight, later} {
			if a, _ := e.rec.count(o.Key()); a != 1 {
				t.Errorf("%s applied %d times, want 1", o.Key(), a)
			}
		}
		e.audit(inFlight, later)
	}},
	{name: "KillMidHandler", needs: func(f Features, batch bool) string {
		if !f.Kill {
			return "the harness cannot kill a consumer (Features.Kill)"
		}
		return perMessage(f, batch)
	}, run: func(s *suite, t *testing.T) {
		// Kill the consumer while its handler runs, then let the handler
		// commit: the next consumer gets the message again and finds it
		// applied (or applies it, if the commit did not land): once.
		e := s.newEnv(t)
		e.ensureSchema()
		o := newOrder(14)
		entered, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		e.setHook(func(context.Context, *sql.Tx, order) error {
			if once.Swap(true) {
				return nil
			}
			close(entered)
			<-release
			return nil
		})
		e.publish(o, time.Now(), time.Time{}, nil)
		c := e.start(e.config())
		<-entered
		if err := c.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		close(release)
		e.start(e.config())
		e.waitFor("the redelivery acked by the next consumer", func() bool { return len(e.rec.of(o.Key(), adapter.Ack, 2)) >= 1 })
		e.stopAll()
		if a, _ := e.rec.count(o.Key()); a != 1 {
			t.Errorf("applied %d times, want 1", a)
		}
		e.audit(o)
	}},
	{name: "StrictGuard", needs: perMessage, run: func(s *suite, t *testing.T) {
		// A handler that ends the claim's transaction itself is refused
		// (ErrAutocommit), never acked, and nothing commits.
		e := s.newEnv(t, idempotent.WithStrictGuard())
		e.ensureSchema()
		o := newOrder(15)
		e.setHook(func(ctx context.Context, tx *sql.Tx, _ order) error {
			_, _ = tx.ExecContext(ctx, "COMMIT") // the bug: the error ignored
			return nil
		})
		e.publish(o, time.Now(), time.Time{}, nil)
		e.start(e.config())
		e.waitFor("the delivery refused", func() bool { return len(e.rec.of(o.Key(), 0, 0)) >= 1 })
		e.stopAll()
		for i, st := range e.rec.of(o.Key(), 0, 0) {
			if i > 0 && released(st) {
				continue
			}
			if st.Action == adapter.Ack || !errors.Is(st.Err, idempotent.ErrAutocommit) {
				t.Errorf("a handler ending the transaction: %v (%v), want a refusal matching ErrAutocommit", st.Action, st.Err)
			}
		}
		t.Logf("refused: %v", e.rec.of(o.Key(), 0, 0)[0].Err)
		e.audit()
	}},
	{name: "TxOptions", needs: perMessage, run: func(s *suite, t *testing.T) {
		// The Middleware's transaction options reach the handler's
		// transaction.
		e := s.newEnv(t, idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
		e.ensureSchema()
		o := newOrder(16)
		e.setHook(func(ctx context.Context, tx *sql.Tx, _ order) error {
			var level string
			if err := tx.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&level); err != nil {
				return err
			}
			if level != "serializable" {
				return fmt.Errorf("brokertest: the handler's transaction is %q, want serializable", level)
			}
			return nil
		})
		e.publish(o, time.Now(), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.stopAll()
		if rq := e.rec.of(o.Key(), adapter.Requeue, 0); len(rq) != 0 {
			t.Errorf("requeued: %v", rq[0].Err)
		}
		e.want(o.Key(), 1, 0)
		e.audit(o)
		e.atBroker()
	}},
}

// released reports a requeue that a shutdown made: a delivery handed back
// without running the handler (no error), or one whose transaction the
// shutdown cancelled (context.Canceled).
func released(st Settlement) bool {
	return st.Action == adapter.Requeue && (st.Err == nil || errors.Is(st.Err, context.Canceled))
}

// wantOnlyPoison checks key was settled exactly once, as poison with an
// error matching want.
func wantOnlyPoison(t *testing.T, e *env, key string, want error) {
	t.Helper()
	all := e.rec.of(key, 0, 0)
	if len(all) != 1 || all[0].Action != adapter.DeadLetter || !errors.Is(all[0].Err, want) {
		t.Errorf("%s settled %+v, want poison exactly once, matching %v", key, all, want)
		return
	}
	t.Logf("%s poisoned: %v", key, all[0].Err)
	e.deadLettered(key)
}
