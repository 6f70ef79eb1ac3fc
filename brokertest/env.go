package brokertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// order is the suite's message: so many points for a customer.
type order = testenv.Order

// waitWithin bounds every wait for a settlement.
const waitWithin = 20 * time.Second

// settled is one settlement and the consumer (by start order, from 1)
// that made it.
type settled struct {
	Settlement
	by int
}

// record is the suite's view of a scenario: the Middleware's outcomes (it
// is the Middleware's observer) and the consumers' settlements, by key.
type record struct {
	mu          sync.Mutex
	outcomes    map[string][]idempotent.Outcome
	settlements map[string][]settled
}

func (r *record) Outcome(_ context.Context, e idempotent.Event) {
	if e.Err != nil {
		return
	}
	r.mu.Lock()
	r.outcomes[e.Key] = append(r.outcomes[e.Key], e.Outcome)
	r.mu.Unlock()
}

func (r *record) Retry(context.Context, idempotent.RetryEvent) {}

// observer returns the Observer of consumer by: it records each
// delivery's settlement from the adapter's events.
func (r *record) observer(by int) adapter.Observer {
	return adapter.ObserverFunc(func(_ context.Context, ev adapter.Event) {
		s := Settlement{Key: ev.Message.Key, Err: ev.Err, Delay: ev.Delay}
		switch ev.Type {
		case adapter.EventApplied, adapter.EventDuplicate:
			s.Action = adapter.Ack
		case adapter.EventRequeued, adapter.EventReleased:
			s.Action = adapter.Requeue
		case adapter.EventDeadLettered:
			s.Action = adapter.DeadLetter
		default:
			return
		}
		r.mu.Lock()
		r.settlements[s.Key] = append(r.settlements[s.Key], settled{s, by})
		r.mu.Unlock()
	})
}

// of returns key's settlements with action a (any action for 0), by any
// consumer (by 0) or by consumer by.
func (r *record) of(key string, a adapter.Action, by int) []Settlement {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Settlement
	for _, s := range r.settlements[key] {
		if (a == 0 || s.Action == a) && (by == 0 || s.by == by) {
			out = append(out, s.Settlement)
		}
	}
	return out
}

// count returns how many times key was Applied and found Duplicate.
func (r *record) count(key string) (applied, duplicates int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.outcomes[key] {
		switch o {
		case idempotent.Applied:
			applied++
		case idempotent.Duplicate:
			duplicates++
		}
	}
	return applied, duplicates
}

// env is one scenario: a loyalty schema of its own with the claim table,
// a Middleware on it, a transport, and what happened.
type env struct {
	t         *testing.T
	s         *suite
	schema    string
	mw        *idempotent.Middleware
	tr        Transport
	rec       *record
	clock     *testenv.Clock
	consumers []Consumer

	mu sync.Mutex
	// hook, when set, runs in the handler after the balance update and
	// before the ledger row: an error fails the delivery half-way.
	hook func(ctx context.Context, tx *sql.Tx, o order) error
}

// newEnv sets a scenario up; opts are the Middleware's, after the suite's
// own (table, observer, clock) and the mode's.
func (s *suite) newEnv(t *testing.T, opts ...idempotent.Option) *env {
	t.Helper()
	e := &env{t: t, s: s, clock: testenv.NewClock(time.Time{}), rec: &record{outcomes: map[string][]idempotent.Outcome{}, settlements: map[string][]settled{}}}
	e.schema = testenv.LoyaltySchema(t, s.db, "brokertest")
	base := []idempotent.Option{idempotent.WithTable(e.schema + ".processed_messages"), idempotent.WithObserver(e.rec), idempotent.WithClock(e.clock.Now)}
	modeOpts, err := s.mode.opts()
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(s.db, postgres.New(), "brokertest", append(append(base, modeOpts...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.mw = mw
	e.tr = s.h.Open(t)
	return e
}

// ensureSchema creates the claim table (and partitions) at the clock's
// time.
func (e *env) ensureSchema() {
	e.t.Helper()
	if err := e.mw.EnsureSchema(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) setHook(h func(ctx context.Context, tx *sql.Tx, o order) error) {
	e.mu.Lock()
	e.hook = h
	e.mu.Unlock()
}

// credit is the effect: the balance, then (unless the hook fails) the
// ledger row, through tx.
func (e *env) credit(ctx context.Context, tx *sql.Tx, o order) error {
	q := `"` + e.schema + `"`
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID); err != nil {
		return err
	}
	e.mu.Lock()
	hook := e.hook
	e.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, tx, o); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (order_id, customer_id, points) VALUES ($1, $2, $3)", o.OrderID, o.CustomerID, o.Points)
	return err
}

func decode(body []byte) (order, error) {
	var o order
	if err := json.Unmarshal(body, &o); err != nil {
		return o, fmt.Errorf("brokertest: body %q: %w", body, err)
	}
	return o, nil
}

func (e *env) handler(ctx context.Context, tx *sql.Tx, body []byte) error {
	o, err := decode(body)
	if err != nil {
		return err
	}
	return e.credit(ctx, tx, o)
}

func (e *env) batchHandler(ctx context.Context, tx *sql.Tx, bodies [][]byte) error {
	for _, b := range bodies {
		if err := e.handler(ctx, tx, b); err != nil {
			return err
		}
	}
	return nil
}

// config is the default consumer of the scenario's mode: its workers (one
// in the per-message and batch modes), batches of up to 10 in batch mode.
func (e *env) config() ConsumerConfig {
	return ConsumerConfig{
		Middleware: e.mw, DB: e.s.db, Handler: e.handler,
		Batch: e.s.batch, BatchSize: 10, BatchHandler: e.batchHandler,
		Workers: e.s.mode.workers,
	}
}

// start builds and starts a consumer of cfg (Observer set by the suite),
// stopped in Cleanup.
func (e *env) start(cfg ConsumerConfig) Consumer {
	e.t.Helper()
	by := len(e.consumers) + 1
	cfg.Observer = e.rec.observer(by)
	c, err := e.tr.NewConsumer(cfg)
	if err != nil {
		e.t.Fatalf("NewConsumer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.consumers = append(e.consumers, c)
	e.t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

// stop stops c gracefully, failing the scenario on an error.
func (e *env) stop(c Consumer) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		e.t.Fatalf("Stop: %v", err)
	}
}

// stopAll stops every consumer, so that what is counted next is final.
func (e *env) stopAll() {
	e.t.Helper()
	for _, c := range e.consumers {
		e.stop(c)
	}
}

// publish publishes o with its key, the event time header set to at (as
// adapter.FormatEventTime writes it) unless at is zero, the extra headers
// hdr (which may override it), and the transport time tt.
func (e *env) publish(o order, at time.Time, tt time.Time, hdr map[string]string) {
	e.t.Helper()
	body, err := json.Marshal(o)
	if err != nil {
		e.t.Fatal(err)
	}
	h := map[string]string{}
	if !at.IsZero() {
		h[adapter.EventTimeHeader] = adapter.FormatEventTime(at)
	}
	for k, v := range hdr {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
	defer cancel()
	if err := e.tr.Publish(ctx, Message{Key: o.Key(), Headers: h, Body: body, TransportTime: tt}); err != nil {
		e.t.Fatalf("Publish %s: %v", o.Key(), err)
	}
}

// waitFor polls cond until it holds, failing the scenario after
// waitWithin. It is a bounded poll on what the consumers reported, not a
// sleep standing in for an event.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(waitWithin)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s", waitWithin, what)
		}
		<-tick.C
	}
}

// waitSettled waits until key has at least n settlements with action a.
func (e *env) waitSettled(key string, a adapter.Action, n int) {
	e.t.Helper()
	defer func() {
		if e.t.Failed() {
			e.t.Logf("%s settled %+v", key, e.rec.of(key, 0, 0))
		}
	}()
	e.waitFor(fmt.Sprintf("%d %v of %s", n, a, key), func() bool { return len(e.rec.of(key, a, 0)) >= n })
}

// want checks key was Applied and found Duplicate exactly so many times.
func (e *env) want(key string, applied, duplicates int) {
	e.t.Helper()
	if a, d := e.rec.count(key); a != applied || d != duplicates {
		e.t.Errorf("%s: %d applied, %d duplicates; want %d and %d", key, a, d, applied, duplicates)
	}
}

// audit checks the effects are exactly those of orders, each once.
func (e *env) audit(orders ...order) {
	e.t.Helper()
	testenv.AuditOrders(e.t, e.s.db, e.schema, orders)
}

// newOrder returns order id for customer 1 + id%97.
func newOrder(id int64) order {
	return order{OrderID: id, CustomerID: 1 + id%97, Points: 1 + id%37}
}
