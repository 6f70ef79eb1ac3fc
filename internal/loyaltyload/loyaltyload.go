// Package loyaltyload is the loyalty workload of the guide, written once for
// the benchmark command (bench/) and the go test benchmarks (tests/): per
// message, add points to a balance and write a ledger row, in the variants
// the benchmarks compare — the effect alone, the guide's hand-written claim
// and effect, the middleware's ProcessMessage, its strict guard, batches with
// set-wise effects, and the duplicate path.
package loyaltyload

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// Consumer is the consumer name every variant claims under.
const Consumer = "loyalty"

// Duplicates is how many keys Setup claims in advance for the duplicate
// path.
const Duplicates = 1000

// Schema is a benchmark's own Postgres schema with the loyalty tables.
type Schema struct {
	Name      string
	Customers int
	// Hot is the share of messages (0 to 1) whose customer is one of the
	// first HotCustomers, for a hot-key workload; 0, the default, draws
	// every customer alike. Generators made after it is set follow it.
	Hot          float64
	HotCustomers int
}

// Setup creates a fresh schema holding balances for customers 1..customers,
// an empty ledger and the claim table, and claims Duplicates keys (see
// Gen.DupKey) in advance. Drop removes it.
func Setup(ctx context.Context, db *sql.DB, name string, customers int) (*Schema, error) {
	q := pq.QuoteIdentifier(name)
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.point_ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL);
INSERT INTO %[1]s.balances SELECT g, 0 FROM generate_series(1, %[2]d) g;`, q, customers)); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	s := &Schema{Name: name, Customers: customers}
	mw, err := idempotent.New(db, postgres.New(), Consumer, idempotent.WithTable(s.claimTable()))
	if err != nil {
		return nil, err
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s.processed_messages (consumer, message_key) SELECT $1, 'dup:' || g FROM generate_series(0, %d) g", q, Duplicates-1), Consumer); err != nil {
		return nil, fmt.Errorf("seed duplicates: %w", err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+q+".balances"); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Schema) claimTable() string { return s.Name + ".processed_messages" }

// Drop drops the schema and everything in it.
func (s *Schema) Drop(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, "DROP SCHEMA "+pq.QuoteIdentifier(s.Name)+" CASCADE")
	return err
}

// Msg is one OrderCompleted event.
type Msg struct {
	OrderID, CustomerID, Points int64
}

// Key is the message's claim key.
func (m Msg) Key() string { return "order-completed:" + strconv.FormatInt(m.OrderID, 10) }

func msgOf(m Msg) (idempotent.Message, error) { return idempotent.Message{Key: m.Key()}, nil }

// Gen makes messages for one worker: unique order ids from a shared
// counter, random customers (a share of them hot, as the schema says).
type Gen struct {
	rng       *rand.Rand
	next      *atomic.Int64
	customers int
	hot       float64
	hotN      int
	batch     []Msg
}

// NewGen returns a generator drawing order ids from next.
func NewGen(s *Schema, next *atomic.Int64, seed uint64) *Gen {
	return &Gen{rng: rand.New(rand.NewPCG(seed, 0x10ca1)), next: next, customers: s.Customers,
		hot: s.Hot, hotN: min(max(s.HotCustomers, 1), s.Customers)}
}

// Next returns a new message.
func (g *Gen) Next() Msg {
	n := g.customers
	if g.hot > 0 && g.rng.Float64() < g.hot {
		n = g.hotN
	}
	return Msg{OrderID: g.next.Add(1), CustomerID: int64(g.rng.IntN(n)) + 1, Points: 10}
}

// NextN returns n new messages in a slice reused by the next call.
func (g *Gen) NextN(n int) []Msg {
	g.batch = g.batch[:0]
	for range n {
		g.batch = append(g.batch, g.Next())
	}
	return g.batch
}

// DupKey returns one of the keys Setup claimed in advance.
func (g *Gen) DupKey() string { return "dup:" + strconv.Itoa(g.rng.IntN(Duplicates)) }

// Env runs the variants on one database (and, for the guarded variant, a
// second one opened through idempotent.GuardConnector).
type Env struct {
	db      *sql.DB
	plain   *idempotent.Middleware
	strict  *idempotent.Middleware
	guarded *idempotent.Middleware
	// coalesced are WithCoalescing Middlewares, by variant name.
	coalesced map[string]*idempotent.Middleware
	batch     func(context.Context, []Msg) ([]idempotent.Outcome, error)
	int64s    func([]int64) any
	updateSQL string
	ledgerSQL string
	claimSQL  string
	batchUpd  string
	batchLdg  string
}

// NewEnv prepares the variants on db for schema s. guarded may be nil, and
// then the guarded variant fails. nativeArrays says the driver takes
// []int64 parameters as they are (pgx); otherwise they go through
// pq.Array (lib/pq). Every Middleware of the Env gets opts too (an
// observer, say).
func NewEnv(db, guarded *sql.DB, s *Schema, nativeArrays bool, opts ...idempotent.Option) (*Env, error) {
	q := pq.QuoteIdentifier(s.Name)
	e := &Env{
		db:        db,
		updateSQL: "UPDATE " + q + ".balances SET points = points + $1 WHERE customer_id = $2",
		ledgerSQL: "INSERT INTO " + q + ".point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)",
		// The guide's claim, with the consumer written into the SQL.
		claimSQL: "INSERT INTO " + q + ".processed_messages (consumer, message_key) VALUES ('" + Consumer + "', $1) ON CONFLICT DO NOTHING",
		batchUpd: "UPDATE " + q + ".balances b SET points = b.points + u.p FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) WHERE b.customer_id = u.c",
		batchLdg: "INSERT INTO " + q + ".point_ledger (customer_id, order_id, points) SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])",
		int64s:   func(a []int64) any { return pq.Array(a) },
	}
	if nativeArrays {
		e.int64s = func(a []int64) any { return a }
	}
	var err error
	with := func(more ...idempotent.Option) []idempotent.Option {
		return append(append([]idempotent.Option{idempotent.WithTable(s.claimTable())}, opts...), more...)
	}
	if e.plain, err = idempotent.New(db, postgres.New(), Consumer, with()...); err != nil {
		return nil, err
	}
	if e.strict, err = idempotent.New(db, postgres.New(), Consumer, with(idempotent.WithStrictGuard())...); err != nil {
		return nil, err
	}
	e.coalesced = map[string]*idempotent.Middleware{}
	for name, c := range coalescings {
		if e.coalesced[name], err = idempotent.New(db, postgres.New(), Consumer, with(idempotent.WithCoalescing(c))...); err != nil {
			return nil, err
		}
	}
	if guarded != nil {
		if e.guarded, err = idempotent.New(guarded, postgres.New(), Consumer, with()...); err != nil {
			return nil, err
		}
	}
	e.batch = idempotent.WrapMessages(e.plain, msgOf, e.creditBatch)
	return e, nil
}

// credit is the guide's effect for one message.
func (e *Env) credit(ctx context.Context, tx *sql.Tx, m Msg) error {
	if _, err := tx.ExecContext(ctx, e.updateSQL, m.Points, m.CustomerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, e.ledgerSQL, m.CustomerID, m.OrderID, m.Points)
	return err
}

// creditBatch is the effect of many messages written set-wise: one UPDATE
// of every balance concerned (in ascending customer order, points summed per
// customer) and one INSERT of every ledger row.
func (e *Env) creditBatch(ctx context.Context, tx *sql.Tx, msgs []Msg) error {
	n := len(msgs)
	buf := make([]int64, 5*n)
	cust, order, pts, ids, adds := buf[:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:3*n:4*n], buf[4*n:4*n:5*n]
	for i, m := range msgs {
		cust[i], order[i], pts[i] = m.CustomerID, m.OrderID, m.Points
	}
	sorted := slices.Clone(msgs)
	slices.SortFunc(sorted, func(a, b Msg) int { return cmp.Compare(a.CustomerID, b.CustomerID) })
	for _, m := range sorted {
		if k := len(ids); k > 0 && ids[k-1] == m.CustomerID {
			adds[k-1] += m.Points
			continue
		}
		ids = append(ids, m.CustomerID)
		adds = append(adds, m.Points)
	}
	if _, err := tx.ExecContext(ctx, e.batchUpd, e.int64s(ids), e.int64s(adds)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, e.batchLdg, e.int64s(cust), e.int64s(order), e.int64s(pts))
	return err
}

// Variant is one way of applying messages.
type Variant struct {
	// Name is the short name used on the command line.
	Name string
	// Label is the report's description, starting with the letter.
	Label string
	// PerCall is how many messages one call of Run applies.
	PerCall int
	// Run applies PerCall messages.
	Run func(ctx context.Context, e *Env, g *Gen) error
}

// Variants returns every variant, in the report's order.
func Variants() []Variant {
	return []Variant{
		{Name: "effect", Label: "(a) effect alone, hand-written", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Effect(ctx, g) }},
		{Name: "handwritten", Label: "(b) guide's claim + effect, hand-written", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.HandWritten(ctx, g) }},
		{Name: "process", Label: "(c) ProcessMessage, defaults", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Process(ctx, g) }},
		{Name: "event", Label: "(c\") ProcessMessage with an event time (the retention horizon's fence)", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Event(ctx, g) }},
		{Name: "guarded", Label: "(c') ProcessMessage on a GuardConnector database", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Guarded(ctx, g) }},
		{Name: "strict", Label: "(d) ProcessMessage, WithStrictGuard", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Strict(ctx, g) }},
		{Name: "batch10", Label: "(e) ProcessMessages, 10 per tx, set-wise effect", PerCall: 10, Run: batchOf(10)},
		{Name: "batch100", Label: "(e) ProcessMessages, 100 per tx, set-wise effect", PerCall: 100, Run: batchOf(100)},
		coalesced("coalesce4", "(g) ProcessMessage, WithCoalescing: up to 4 per tx, 1ms wait"),
		coalesced("coalesce8", "(g) ProcessMessage, WithCoalescing: up to 8 per tx, 1ms wait"),
		coalesced("coalesce4sp", "(g') ProcessMessage, WithCoalescing with savepoints: up to 4 per tx, 1ms wait"),
		coalesced("coalesce8sp", "(g') ProcessMessage, WithCoalescing with savepoints: up to 8 per tx, 1ms wait"),
		coalesced("coalesce16", "(g) ProcessMessage, WithCoalescing: up to 16 per tx, 1ms wait"),
		coalesced("coalesce16sp", "(g') ProcessMessage, WithCoalescing with savepoints: up to 16 per tx, 1ms wait"),
		{Name: "duplicate", Label: "(f) ProcessMessage, duplicate path", PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.Duplicate(ctx, g) }},
	}
}

// Effect applies one message's effect in a transaction, with no claim: the
// baseline (a).
func (e *Env) Effect(ctx context.Context, g *Gen) error {
	m := g.Next()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := e.credit(ctx, tx, m); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// HandWritten is the guide's Step 2 written by hand: claim, and apply the
// effect only if the claim inserted, in one transaction.
func (e *Env) HandWritten(ctx context.Context, g *Gen) error {
	m := g.Next()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, e.claimSQL, m.Key())
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if n == 0 {
		return tx.Commit()
	}
	if err := e.credit(ctx, tx, m); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Process applies one message with the middleware's defaults.
func (e *Env) Process(ctx context.Context, g *Gen) error {
	return e.process(ctx, e.plain, g)
}

// Event applies one message with the middleware's defaults and an event
// time, so that its claim is fenced by the claim table's retention horizon,
// read in the claim statement itself.
func (e *Env) Event(ctx context.Context, g *Gen) error {
	m := g.Next()
	out, err := e.plain.ProcessMessage(ctx, idempotent.Message{Key: m.Key(), EventTime: time.Now()}, func(ctx context.Context, tx *sql.Tx) error { return e.credit(ctx, tx, m) })
	if err == nil && out != idempotent.Applied {
		err = fmt.Errorf("message %d: %v, want applied", m.OrderID, out)
	}
	return err
}

// Strict applies one message with WithStrictGuard.
func (e *Env) Strict(ctx context.Context, g *Gen) error {
	return e.process(ctx, e.strict, g)
}

// Guarded applies one message through a GuardConnector database.
func (e *Env) Guarded(ctx context.Context, g *Gen) error {
	if e.guarded == nil {
		return errors.New("no guarded database")
	}
	return e.process(ctx, e.guarded, g)
}

func (e *Env) process(ctx context.Context, mw *idempotent.Middleware, g *Gen) error {
	m := g.Next()
	out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: m.Key()}, func(ctx context.Context, tx *sql.Tx) error { return e.credit(ctx, tx, m) })
	if err == nil && out != idempotent.Applied {
		err = fmt.Errorf("message %d: %v, want applied", m.OrderID, out)
	}
	return err
}

// Duplicate processes a message claimed before: the handler never runs.
func (e *Env) Duplicate(ctx context.Context, g *Gen) error {
	out, err := e.plain.ProcessMessage(ctx, idempotent.Message{Key: g.DupKey()}, func(context.Context, *sql.Tx) error {
		return errors.New("the handler ran for a duplicate")
	})
	if err == nil && out != idempotent.Duplicate {
		err = fmt.Errorf("duplicate path: %v, want duplicate", out)
	}
	return err
}

// coalescings are the bounds of the coalesced variants (g) and (g'), by
// name: groups of up to 4, 8 or 16 messages, open 1ms, optimistic or with
// savepoints.
var coalescings = map[string]idempotent.Coalescing{
	"coalesce4":    {Max: 4, Wait: time.Millisecond},
	"coalesce8":    {Max: 8, Wait: time.Millisecond},
	"coalesce4sp":  {Max: 4, Wait: time.Millisecond, Savepoints: true},
	"coalesce8sp":  {Max: 8, Wait: time.Millisecond, Savepoints: true},
	"coalesce16":   {Max: 16, Wait: time.Millisecond},
	"coalesce16sp": {Max: 16, Wait: time.Millisecond, Savepoints: true},
}

// coalesced returns the variant that runs ProcessMessage on the coalesced
// Middleware of that name.
func coalesced(name, label string) Variant {
	return Variant{Name: name, Label: label, PerCall: 1, Run: func(ctx context.Context, e *Env, g *Gen) error { return e.process(ctx, e.coalesced[name], g) }}
}

// batchOf returns a variant running batches of n new messages.
func batchOf(n int) func(context.Context, *Env, *Gen) error {
	return func(ctx context.Context, e *Env, g *Gen) error {
		_, err := e.batch(ctx, g.NextN(n))
		return err
	}
}
