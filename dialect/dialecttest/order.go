package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// The checks of ordered mode (idempotent.WithOrdering, dialect.Orderer).
// Each records, per entity, the order in which effects applied, in an
// audit table written in the effect's transaction: a row (entity, seq,
// pos) whose pos is one more than the entity's rows before it.

// orderAudit is the audit table "<table>_audit".
type orderAudit struct {
	db   *sql.DB
	name string
}

func newOrderAudit(t *testing.T, db *sql.DB, table string) *orderAudit {
	t.Helper()
	name := table + "_audit"
	dropAtEnd(t, db, name)
	if _, err := db.Exec("CREATE TABLE " + name + " (entity VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, pos INTEGER NOT NULL)"); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return &orderAudit{db: db, name: name}
}

// record appends (entity, seq) to the entity's applied effects, through tx.
// entity is one of the checks' own plain names, written into the text.
func (a *orderAudit) record(ctx context.Context, tx *sql.Tx, entity string, seq int64) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (entity, seq, pos) SELECT '%s', %d, COUNT(*) + 1 FROM %s WHERE entity = '%s'",
		a.name, entity, seq, a.name, entity))
	return err
}

// process delivers msg to mw with a handler that records it.
func (a *orderAudit) process(ctx context.Context, mw *idempotent.Middleware, msg idempotent.Message) (idempotent.Outcome, error) {
	return mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		return a.record(ctx, tx, msg.OrderKey, msg.OrderSeq)
	})
}

// applied returns the sequences applied for entity, in the order they
// applied.
func (a *orderAudit) applied(t testing.TB, entity string) []int64 {
	t.Helper()
	rows, err := a.db.Query(fmt.Sprintf("SELECT seq, pos FROM %s WHERE entity = '%s' ORDER BY pos, seq", a.name, entity))
	if err != nil {
		t.Fatalf("read %s: %v", a.name, err)
	}
	defer rows.Close()
	var out []int64
	var lastPos int64
	for rows.Next() {
		var seq, pos int64
		if err := rows.Scan(&seq, &pos); err != nil {
			t.Fatalf("read %s: %v", a.name, err)
		}
		if pos == lastPos {
			t.Errorf("entity %s: two effects applied at position %d (concurrently)", entity, pos)
		}
		lastPos = pos
		out = append(out, seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read %s: %v", a.name, err)
	}
	return out
}

// orderPayload is the payload of the checks' messages: "entity:seq".
func orderPayload(entity string, seq int64) []byte {
	return []byte(entity + ":" + strconv.FormatInt(seq, 10))
}

// releaseInto returns an Ordering.Release that records a parked message in
// a, after checking that its payload and headers came back as parked.
func releaseInto(a *orderAudit) func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
	return func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
		entity, seq, ok := strings.Cut(string(p.Payload), ":")
		if !ok || entity != p.OrderKey || seq != strconv.FormatInt(p.OrderSeq, 10) || p.Headers["entity"] != entity {
			return fmt.Errorf("parked message %q came back as payload %q, headers %v, ordering key %q, sequence %d", p.Key, p.Payload, p.Headers, p.OrderKey, p.OrderSeq)
		}
		return a.record(ctx, tx, p.OrderKey, p.OrderSeq)
	}
}

func orderedMessage(entity string, seq int64) idempotent.Message {
	return idempotent.Message{
		Key:      fmt.Sprintf("%s-%d", entity, seq),
		OrderKey: entity, OrderSeq: seq,
		Payload: orderPayload(entity, seq),
		Headers: map[string]string{"entity": entity},
	}
}

// orderSetup skips t unless the dialect is an Orderer, and returns a
// Middleware WithOrdering whose Release records into a fresh audit table.
func orderSetup(t *testing.T, e *Env, opts ...idempotent.Option) (context.Context, *sql.DB, string, *orderAudit, *idempotent.Middleware) {
	t.Helper()
	needOrderer(t, e)
	db := e.DB(t)
	table := e.Table(t, db)
	a := newOrderAudit(t, db, table)
	opts = append([]idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: releaseInto(a)})}, opts...)
	mw := e.Middleware(t, db, table, "ordered", opts...)
	return testContext(t), db, table, a, mw
}

func needOrderer(t *testing.T, e *Env) {
	t.Helper()
	if _, ok := e.Dialect().(dialect.Orderer); !ok {
		t.Skipf("the %s dialect is no dialect.Orderer", e.Dialect().Name())
	}
}

// wantOrder fails t unless entity's effects applied exactly as want.
func wantOrder(t *testing.T, a *orderAudit, entity string, want ...int64) {
	t.Helper()
	if got := a.applied(t, entity); !slices.Equal(got, want) {
		t.Errorf("entity %s: effects applied in the order %v, want %v", entity, got, want)
	}
}

func seqs(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// checkOrderShuffled delivers every sequence of many entities shuffled,
// with re-sends and redeliveries after a commit whose ack was lost, to
// concurrent workers, one message per transaction: each entity's effects
// must apply once each, in sequence order, and nothing may be left parked.
func checkOrderShuffled(t *testing.T, e *Env) { orderShuffled(t, e, 1, nil) }

// checkOrderBatchShuffled is checkOrderShuffled with ProcessMessages: each
// worker takes up to 16 deliveries at once, so a batch holds several
// messages of an entity, in any order, some next, some ahead, some
// duplicates.
func checkOrderBatchShuffled(t *testing.T, e *Env) { orderShuffled(t, e, 16, nil) }

// checkOrderCoalescedShuffled is checkOrderShuffled under WithCoalescing,
// optimistic and with savepoints: ordered messages of different entities
// share a group's transaction, and a group never runs two handlers of one
// entity.
func checkOrderCoalescedShuffled(t *testing.T, e *Env) {
	for _, savepoints := range []bool{false, true} {
		t.Run(fmt.Sprintf("savepoints=%v", savepoints), func(t *testing.T) {
			// A short wait: a group that a deferred member keeps below Max
			// closes soon (the wait bounds speed, never correctness).
			orderShuffled(t, e, 1, &idempotent.Coalescing{Max: 8, Wait: 10 * time.Millisecond, Savepoints: savepoints})
		})
	}
}

// orderShuffled is checkOrderShuffled with batches of up to batch
// deliveries (1: ProcessMessage), or, with co, ProcessMessage under
// WithCoalescing(*co).
func orderShuffled(t *testing.T, e *Env, batch int, co *idempotent.Coalescing) {
	var opts []idempotent.Option
	if co != nil {
		opts = append(opts, idempotent.WithCoalescing(*co))
	}
	ctx, _, _, a, mw := orderSetup(t, e, opts...)
	groups := &groupAudit{txs: map[*sql.Tx][]string{}}

	const entities, perEntity, workers = 60, 12, 8
	rng := rand.New(rand.NewPCG(1, 2))
	var deliveries []idempotent.Message
	for i := range entities {
		for s := int64(1); s <= perEntity; s++ {
			m := orderedMessage(fmt.Sprintf("e%d", i), s)
			deliveries = append(deliveries, m)
			if rng.IntN(10) < 3 { // 30% re-sent by the producer
				deliveries = append(deliveries, m)
			}
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	type delivery struct {
		msg     idempotent.Message
		crashed bool // already redelivered once after a lost ack
		fails   int
	}
	queue := make(chan delivery, len(deliveries)*8)
	var pending sync.WaitGroup
	for _, m := range deliveries {
		pending.Add(1)
		queue <- delivery{msg: m}
	}
	// take returns the next delivery and up to batch-1 more that are
	// waiting, or false once the queue is closed.
	take := func() ([]delivery, bool) {
		d, ok := <-queue
		if !ok {
			return nil, false
		}
		ds := []delivery{d}
		for len(ds) < batch {
			select {
			case d, ok := <-queue:
				if !ok {
					return ds, true
				}
				ds = append(ds, d)
				continue
			default:
			}
			break
		}
		return ds, true
	}
	var mu sync.Mutex
	var failures []error
	var outcomes [4]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				ds, ok := take()
				if !ok {
					return
				}
				msgs := make([]idempotent.Message, len(ds))
				for i, d := range ds {
					msgs[i] = d.msg
				}
				var outs []idempotent.Outcome
				var err error
				if co != nil {
					var out idempotent.Outcome
					out, err = groups.process(ctx, a, mw, msgs[0])
					outs = []idempotent.Outcome{out}
				} else {
					outs, err = a.processBatch(ctx, mw, msgs)
				}
				for i, d := range ds {
					switch {
					case err != nil && d.fails < 5:
						d.fails++
						pending.Add(1)
						queue <- d // the broker redelivers a failed delivery
					case err != nil:
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
					case !d.crashed && wrng.IntN(10) == 0:
						// Committed, then the consumer crashed before the
						// ack: the broker delivers it again.
						d.crashed = true
						pending.Add(1)
						queue <- d
					}
					if err == nil {
						outcomes[outs[i]].Add(1)
					}
					pending.Done()
				}
			}
		}()
	}
	pending.Wait()
	close(queue)
	wg.Wait()
	for _, err := range failures {
		t.Errorf("delivery failed for good: %v", err)
	}
	for i := range entities {
		wantOrder(t, a, fmt.Sprintf("e%d", i), seqs(1, perEntity)...)
	}
	waiting, err := mw.Waiting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(waiting) != 0 {
		t.Errorf("left parked: %+v", waiting)
	}
	t.Logf("%d deliveries: %d applied, %d parked, %d duplicate", len(deliveries), outcomes[idempotent.Applied].Load(), outcomes[idempotent.Parked].Load(), outcomes[idempotent.Duplicate].Load())
	if outcomes[idempotent.Parked].Load() == 0 {
		t.Errorf("no delivery was parked: the check did not exercise parking")
	}
	if co != nil {
		groups.check(t)
	}
}

// groupAudit records, per transaction, the entities whose handlers ran in
// it.
type groupAudit struct {
	mu  sync.Mutex
	txs map[*sql.Tx][]string // kept, so that no address is reused
}

// process is orderAudit.process, recording the handler's transaction.
func (g *groupAudit) process(ctx context.Context, a *orderAudit, mw *idempotent.Middleware, msg idempotent.Message) (idempotent.Outcome, error) {
	return mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		g.mu.Lock()
		g.txs[tx] = append(g.txs[tx], msg.OrderKey)
		g.mu.Unlock()
		return a.record(ctx, tx, msg.OrderKey, msg.OrderSeq)
	})
}

// check fails t unless some transaction ran the handlers of several
// entities, and none ran two of one entity.
func (g *groupAudit) check(t *testing.T) {
	t.Helper()
	shared, handlers := 0, 0
	for _, entities := range g.txs {
		handlers += len(entities)
		if len(entities) > 1 {
			shared++
		}
		seen := map[string]bool{}
		for _, e := range entities {
			if seen[e] {
				t.Errorf("one transaction ran two handlers of entity %s: %v", e, entities)
			}
			seen[e] = true
		}
	}
	t.Logf("%d handlers in %d transactions, %d of them shared", handlers, len(g.txs), shared)
	if shared == 0 {
		t.Errorf("no transaction ran the handlers of several entities: ordered messages were not coalesced")
	}
}

// processBatch delivers msgs: one alone through process, several together
// with ProcessMessages and a handler that records the fresh ones in the
// order it is given them.
func (a *orderAudit) processBatch(ctx context.Context, mw *idempotent.Middleware, msgs []idempotent.Message) ([]idempotent.Outcome, error) {
	if len(msgs) == 1 {
		out, err := a.process(ctx, mw, msgs[0])
		return []idempotent.Outcome{out}, err
	}
	return mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		for _, i := range fresh {
			if err := a.record(ctx, tx, msgs[i].OrderKey, msgs[i].OrderSeq); err != nil {
				return err
			}
		}
		return nil
	})
}

// gapObserver records the gaps CheckGaps reports.
type gapObserver struct {
	mu   sync.Mutex
	gaps []idempotent.Gap
}

func (*gapObserver) Outcome(context.Context, idempotent.Event)    {}
func (*gapObserver) Retry(context.Context, idempotent.RetryEvent) {}
func (o *gapObserver) Gap(_ context.Context, g idempotent.Gap) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gaps = append(o.gaps, g)
}

// gapSetup is orderSetup's start for a check that moves the clock: the
// clock, at now (microseconds since the Unix epoch), for WithClock.
func gapSetup(t *testing.T, e *Env) (context.Context, *sql.DB, string, *orderAudit, *atomic.Int64, func() time.Time) {
	t.Helper()
	needOrderer(t, e)
	db := e.DB(t)
	table := e.Table(t, db)
	now := new(atomic.Int64)
	now.Store(time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC).UnixMicro())
	return testContext(t), db, table, newOrderAudit(t, db, table), now, func() time.Time { return time.UnixMicro(now.Load()) }
}

// checkOrderGapSkip: sequence 5 never arrives; 6 to 10 park; the gap is
// reported once GapTimeout has passed; the operator's SkipGap applies 6 to
// 10 in order; a late 5 is refused with ErrSkippedSequence, naming it.
func checkOrderGapSkip(t *testing.T, e *Env) {
	ctx, db, table, a, now, clock := gapSetup(t, e)
	obs := &gapObserver{}
	mw := e.Middleware(t, db, table, "ordered", idempotent.WithClock(clock), idempotent.WithObserver(obs),
		idempotent.WithOrdering(idempotent.Ordering{Release: releaseInto(a), GapTimeout: time.Minute}))
	process := func(seq int64) (idempotent.Outcome, error) { return a.process(ctx, mw, orderedMessage("g", seq)) }
	for _, s := range []int64{1, 2, 3, 4, 6, 7, 8, 9, 10} {
		want := idempotent.Applied
		if s > 5 {
			want = idempotent.Parked
		}
		if out, err := process(s); err != nil || out != want {
			t.Fatalf("sequence %d: %v, %v; want %v", s, out, err, want)
		}
	}
	wantOrder(t, a, "g", 1, 2, 3, 4)
	gaps, err := mw.CheckGaps(ctx)
	if err != nil || len(gaps) != 0 {
		t.Fatalf("CheckGaps before the timeout: %+v, %v; want none", gaps, err)
	}
	now.Add((2 * time.Minute).Microseconds())
	gaps, err = mw.CheckGaps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(gaps) != 1 || gaps[0].OrderKey != "g" || gaps[0].LastSeq != 4 || gaps[0].NextParked != 6 || gaps[0].Parked != 5 || gaps[0].Policy != idempotent.GapHold {
		t.Fatalf("CheckGaps: %+v; want the gap of g after 4, 5 parked from 6", gaps)
	}
	if len(obs.gaps) != 1 {
		t.Errorf("the observer was told of %d gaps, want 1", len(obs.gaps))
	}
	wantOrder(t, a, "g", 1, 2, 3, 4) // hold: nothing moved
	if _, err := mw.SkipGap(ctx, "g", 6); !errors.Is(err, idempotent.ErrInvalidOrder) {
		t.Errorf("SkipGap over a parked sequence: %v; want ErrInvalidOrder", err)
	}
	n, err := mw.SkipGap(ctx, "g", 5)
	if err != nil || n != 5 {
		t.Fatalf("SkipGap(g, 5): %d, %v; want 5 released", n, err)
	}
	wantOrder(t, a, "g", 1, 2, 3, 4, 6, 7, 8, 9, 10)
	_, err = process(5)
	if !errors.Is(err, idempotent.ErrSkippedSequence) || !strings.Contains(err.Error(), "sequence 5") {
		t.Errorf("late sequence 5 after the skip: %v; want ErrSkippedSequence naming it", err)
	}
	if out, err := process(7); err != nil || out != idempotent.Duplicate {
		t.Errorf("redelivered 7: %v, %v; want Duplicate", out, err)
	}
	if out, err := process(11); err != nil || out != idempotent.Applied {
		t.Errorf("11: %v, %v; want Applied", out, err)
	}
	wantOrder(t, a, "g", 1, 2, 3, 4, 6, 7, 8, 9, 10, 11)
}

// checkOrderParkCrash: a parked message whose ack was lost comes again and
// is a Duplicate of the parked one, not a second copy; so is another
// message with the same sequence; its predecessor releases it once; and
// after the claims are cleaned up, a replay of an applied message is still
// Duplicate.
func checkOrderParkCrash(t *testing.T, e *Env) {
	ctx, db, table, a, mw := orderSetup(t, e)
	process := func(msg idempotent.Message) (idempotent.Outcome, error) { return a.process(ctx, mw, msg) }
	want := func(msg idempotent.Message, want idempotent.Outcome) {
		t.Helper()
		if out, err := process(msg); err != nil || out != want {
			t.Fatalf("%s: %v, %v; want %v", msg.Key, out, err, want)
		}
	}
	want(orderedMessage("p", 2), idempotent.Parked)
	want(orderedMessage("p", 2), idempotent.Duplicate) // the ack was lost
	other := orderedMessage("p", 2)
	other.Key = "p-2-again"
	want(other, idempotent.Duplicate)
	waiting, err := mw.Waiting(ctx)
	if err != nil || len(waiting) != 1 || waiting[0].Parked != 1 {
		t.Fatalf("Waiting: %+v, %v; want one parked message", waiting, err)
	}
	want(orderedMessage("p", 1), idempotent.Applied)
	wantOrder(t, a, "p", 1, 2)
	want(orderedMessage("p", 2), idempotent.Duplicate)
	// The claims are cleaned up; a dead-letter replay of 1 comes weeks
	// later.
	if _, err := db.Exec("DELETE FROM " + table); err != nil {
		t.Fatal(err)
	}
	want(orderedMessage("p", 1), idempotent.Duplicate)
	want(orderedMessage("p", 2), idempotent.Duplicate)
	wantOrder(t, a, "p", 1, 2)
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
}

// checkOrderReleaseCrash: the release of parked successors fails midway
// (as a crash would end it): nothing of the predecessor or the successors
// is committed, they stay parked, and the predecessor's redelivery
// releases them all, once, in order.
func checkOrderReleaseCrash(t *testing.T, e *Env) {
	needOrderer(t, e)
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db)
	a := newOrderAudit(t, db, table)
	var crash atomic.Bool
	crash.Store(true)
	release := releaseInto(a)
	mw := e.Middleware(t, db, table, "ordered", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			if err := release(ctx, tx, p); err != nil {
				return err
			}
			if p.OrderSeq == 3 && crash.Swap(false) {
				return errors.New("crash while releasing")
			}
			return nil
		},
	}))
	process := func(seq int64) (idempotent.Outcome, error) { return a.process(ctx, mw, orderedMessage("r", seq)) }
	for _, s := range []int64{2, 3, 4} {
		if out, err := process(s); err != nil || out != idempotent.Parked {
			t.Fatalf("sequence %d: %v, %v; want Parked", s, out, err)
		}
	}
	if _, err := process(1); err == nil || !strings.Contains(err.Error(), "crash while releasing") {
		t.Fatalf("sequence 1 with the release crashing: %v; want the release's error", err)
	}
	wantOrder(t, a, "r")
	waiting, err := mw.Waiting(ctx)
	if err != nil || len(waiting) != 1 || waiting[0].Parked != 3 || waiting[0].LastSeq != 0 {
		t.Fatalf("Waiting after the crash: %+v, %v; want 3 parked after 0", waiting, err)
	}
	if out, err := process(1); err != nil || out != idempotent.Applied {
		t.Fatalf("sequence 1 again: %v, %v; want Applied", out, err)
	}
	wantOrder(t, a, "r", 1, 2, 3, 4)
}

// checkOrderReleaseCommits: a Release that commits the transaction itself
// (without GuardConnector, nothing stops it) commits what came before it —
// the predecessor, its claim, the sequence moved past the released message
// and that message out of the parking table — as a handler that commits
// commits its claim with its effect so far: the predecessor's call fails,
// its redelivery is a Duplicate, nothing stays parked, and no later skip or
// release applies the released message a second time.
func checkOrderReleaseCommits(t *testing.T, e *Env) {
	needOrderer(t, e)
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db)
	a := newOrderAudit(t, db, table)
	release := releaseInto(a)
	var commits atomic.Int32
	mw := e.Middleware(t, db, table, "ordered", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			if err := release(ctx, tx, p); err != nil {
				return err
			}
			if commits.Add(1) == 1 {
				return tx.Commit() // the mistake
			}
			return nil
		},
	}))
	process := func(seq int64) (idempotent.Outcome, error) { return a.process(ctx, mw, orderedMessage("c", seq)) }
	if out, err := process(2); err != nil || out != idempotent.Parked {
		t.Fatalf("sequence 2: %v, %v; want Parked", out, err)
	}
	if out, err := process(1); err == nil {
		t.Fatalf("sequence 1, its successor's Release committing: %v, nil; want an error", out)
	}
	if out, err := process(1); err != nil || out != idempotent.Duplicate {
		t.Fatalf("sequence 1 redelivered: %v, %v; want Duplicate", out, err)
	}
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Fatalf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
	if gaps, err := mw.CheckGaps(ctx); err != nil || len(gaps) != 0 {
		t.Fatalf("CheckGaps: %+v, %v; want none", gaps, err)
	}
	if out, err := process(3); err != nil || out != idempotent.Applied {
		t.Fatalf("sequence 3: %v, %v; want Applied", out, err)
	}
	wantOrder(t, a, "c", 1, 2, 3)
}

// checkOrderStrictGuard: under WithStrictGuard, the operator's skip and
// the gap policy's transactions pass the guard (they read the transaction
// id as a claim does), and each runs once.
func checkOrderStrictGuard(t *testing.T, e *Env) {
	needOrderer(t, e)
	if e.Dialect().TxIDSQL() == "" {
		t.Skipf("the %s dialect cannot identify transactions: WithStrictGuard is refused", e.Dialect().Name())
	}
	ctx, db, table, a, now, clock := gapSetup(t, e)
	var dead atomic.Int32
	mw := e.Middleware(t, db, table, "ordered", idempotent.WithClock(clock), idempotent.WithStrictGuard(),
		idempotent.WithOrdering(idempotent.Ordering{Release: releaseInto(a), GapTimeout: time.Minute, Policy: idempotent.GapDeadLetter,
			DeadLetter: func(context.Context, idempotent.ParkedMessage) error { dead.Add(1); return nil }}))
	process := func(key string, seq int64) (idempotent.Outcome, error) {
		return a.process(ctx, mw, orderedMessage(key, seq))
	}
	for _, s := range []int64{1, 3, 4} {
		if _, err := process("g", s); err != nil {
			t.Fatalf("g sequence %d: %v", s, err)
		}
	}
	if n, err := mw.SkipGap(ctx, "g", 2); err != nil || n != 2 {
		t.Fatalf("SkipGap(g, 2) under the strict guard: %d, %v; want 2 released", n, err)
	}
	wantOrder(t, a, "g", 1, 3, 4)
	if _, err := process("h", 2); err != nil {
		t.Fatalf("h sequence 2: %v", err)
	}
	now.Add((2 * time.Minute).Microseconds())
	for range 2 {
		if _, err := mw.CheckGaps(ctx); err != nil {
			t.Fatalf("CheckGaps under the strict guard: %v", err)
		}
	}
	if n := dead.Load(); n != 1 {
		t.Errorf("DeadLetter called %d times for one parked message over two CheckGaps, want once", n)
	}
}

// checkOrderBadInput: ordering fields that cannot be used are refused with
// ErrInvalidOrder, naming the problem, before anything is written.
func checkOrderBadInput(t *testing.T, e *Env) {
	ctx, db, table, _, mw := orderSetup(t, e)
	plain := e.Middleware(t, db, table, "plain")
	long := strings.Repeat("k", e.Dialect().(dialect.Orderer).MaxOrderKeyBytes()+1)
	for _, c := range []struct {
		name string
		mw   *idempotent.Middleware
		msg  idempotent.Message
		want string
	}{
		{"no sequence", mw, idempotent.Message{Key: "m1", OrderKey: "a"}, "without a sequence"},
		{"negative sequence", mw, idempotent.Message{Key: "m2", OrderKey: "a", OrderSeq: -3}, "below 1"},
		{"no ordering key", mw, idempotent.Message{Key: "m3", OrderSeq: 4}, "without an ordering key"},
		{"ordering key too long", mw, idempotent.Message{Key: "m4", OrderKey: long, OrderSeq: 1}, "the limit is"},
		{"NUL in ordering key", mw, idempotent.Message{Key: "m5", OrderKey: "a\x00b", OrderSeq: 1}, "NUL"},
		{"not UTF-8", mw, idempotent.Message{Key: "m6", OrderKey: "a\xff", OrderSeq: 1}, "UTF-8"},
		{"no WithOrdering", plain, idempotent.Message{Key: "m7", OrderKey: "a", OrderSeq: 1}, "WithOrdering"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ran := false
			_, err := c.mw.ProcessMessage(ctx, c.msg, func(context.Context, *sql.Tx) error { ran = true; return nil })
			if !errors.Is(err, idempotent.ErrInvalidOrder) || !strings.Contains(err.Error(), c.want) || ran {
				t.Errorf("ProcessMessage: %v (handler ran: %v); want ErrInvalidOrder saying %q", err, ran, c.want)
			}
			if err := c.mw.CheckMessage(c.msg); !errors.Is(err, idempotent.ErrInvalidOrder) {
				t.Errorf("CheckMessage: %v; want ErrInvalidOrder", err)
			}
		})
	}
	ok := orderedMessage("a", 1)
	bad := idempotent.Message{Key: "b2", OrderKey: "a", OrderSeq: -1}
	for _, c := range []struct {
		name string
		mw   *idempotent.Middleware
		msg  idempotent.Message
	}{{"no WithOrdering", plain, ok}, {"negative sequence", mw, bad}} {
		var bke *idempotent.BatchKeyError
		if _, err := c.mw.ProcessMessages(ctx, []idempotent.Message{{Key: "b1"}, c.msg}, func(context.Context, *sql.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrInvalidOrder) || !errors.As(err, &bke) || bke.Index != 1 {
			t.Errorf("ProcessMessages, %s: %v; want a BatchKeyError at 1 matching ErrInvalidOrder", c.name, err)
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mw.ClaimMessage(ctx, tx, ok)
	_ = tx.Rollback()
	if !errors.Is(err, idempotent.ErrInvalidOrder) {
		t.Errorf("ClaimMessage with an ordered message: %v; want ErrInvalidOrder", err)
	}
	if claims := e.Claims(t, db, table); len(claims) != 0 {
		t.Errorf("claims written: %q", claims)
	}
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
}

// checkOrderGapDeadLetter: under GapDeadLetter, an expired gap's parked
// messages go to Ordering.DeadLetter, in order, and leave the parking table
// with their claims, so that their replay from the dead-letter queue is a
// new delivery, parked again while the gap is open.
func checkOrderGapDeadLetter(t *testing.T, e *Env) {
	ctx, db, table, a, now, clock := gapSetup(t, e)
	var dead []string
	// With the pre-check: a parked message is not recorded as seen, so
	// the replay of one the policy dead-lettered reaches the claim table.
	seen, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	mw := e.Middleware(t, db, table, "ordered", idempotent.WithClock(clock), idempotent.WithSeen(seen),
		idempotent.WithOrdering(idempotent.Ordering{Release: releaseInto(a), GapTimeout: time.Minute, Policy: idempotent.GapDeadLetter,
			DeadLetter: func(_ context.Context, p idempotent.ParkedMessage) error {
				dead = append(dead, fmt.Sprintf("%s@%d:%s", p.Key, p.OrderSeq, p.Payload))
				return nil
			}}))
	want := func(seq int64, want idempotent.Outcome) {
		t.Helper()
		if out, err := a.process(ctx, mw, orderedMessage("d", seq)); err != nil || out != want {
			t.Fatalf("sequence %d: %v, %v; want %v", seq, out, err, want)
		}
	}
	want(1, idempotent.Applied)
	want(3, idempotent.Parked)
	want(4, idempotent.Parked)
	now.Add((2 * time.Minute).Microseconds())
	gaps, err := mw.CheckGaps(ctx)
	if err != nil || len(gaps) != 1 || gaps[0].Policy != idempotent.GapDeadLetter || gaps[0].DeadLettered != 2 {
		t.Fatalf("CheckGaps: %+v, %v; want one gap, 2 dead-lettered", gaps, err)
	}
	if got := strings.Join(dead, " "); got != "d-3@3:d:3 d-4@4:d:4" {
		t.Errorf("dead-lettered %q, want d-3 then d-4 with their payloads", got)
	}
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
	want(3, idempotent.Parked) // the replay from the dead-letter queue
	want(2, idempotent.Applied)
	wantOrder(t, a, "d", 1, 2, 3)
}
