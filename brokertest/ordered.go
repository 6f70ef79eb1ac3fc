package brokertest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// OrderedFullEnv is the environment variable that makes the ordered
// scenario run at full size — 2,000 entities × 20 sequence numbers, four
// consumers — instead of the small default CI runs: set it to "1" and
// run one adapter's suite by hand (-run 'TestBrokertest/per-message/Ordered').
const OrderedFullEnv = "IDEMPOTENT_BROKERTEST_ORDERED_FULL"

// orderedScenarios are the checks of idempotent.WithOrdering through the
// adapter, in every mode.
var orderedScenarios = []scenario{
	{name: "Ordered/Shuffled", core: true, run: (*suite).orderedShuffled},
	{name: "Ordered/InOrderNeverParks", needs: routes, run: (*suite).orderedInOrder},
}

// routes is the needs of the scenarios about routing by ordering key.
func routes(f Features, batch bool) string {
	switch {
	case f.RefusesOrdering:
		return "the adapter refuses WithOrdering (Features.RefusesOrdering)"
	case !f.RoutesByOrderKey:
		return "the adapter's workers do not take deliveries by ordering key (Features.RoutesByOrderKey)"
	case batch:
		return "run in per-message mode only"
	}
	return ""
}

// orderAudit is the effect of the ordered scenarios: a row (entity, seq,
// pos) per applied message, pos one more than the entity's rows before it,
// written in the effect's transaction.
type orderAudit struct {
	db    *sql.DB
	table string
}

func newOrderAudit(e *env) *orderAudit {
	a := &orderAudit{db: e.s.db, table: `"` + e.schema + `".order_audit`}
	if _, err := e.s.db.Exec("CREATE TABLE " + a.table + " (entity TEXT NOT NULL, seq BIGINT NOT NULL, pos BIGINT NOT NULL, PRIMARY KEY (entity, pos))"); err != nil {
		e.t.Fatal(err)
	}
	return a
}

// record writes the effect of the message whose body is "entity:seq".
func (a *orderAudit) record(ctx context.Context, tx *sql.Tx, body []byte) error {
	entity, s, ok := strings.Cut(string(body), ":")
	seq, err := strconv.ParseInt(s, 10, 64)
	if !ok || err != nil {
		return adapter.Poison(fmt.Errorf("brokertest: ordered body %q", body))
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO "+a.table+" (entity, seq, pos) SELECT $1, $2, COUNT(*) + 1 FROM "+a.table+" WHERE entity = $1", entity, seq)
	return err
}

func (a *orderAudit) count(t *testing.T) int {
	var n int
	if err := a.db.QueryRow("SELECT COUNT(*) FROM " + a.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// check fails t unless every entity's effects applied once each, in
// sequence order 1..seqs.
func (a *orderAudit) check(t *testing.T, entities, seqs int) {
	t.Helper()
	rows, err := a.db.Query("SELECT entity, seq, pos FROM " + a.table + " ORDER BY entity, pos")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string][]int64{}
	for rows.Next() {
		var entity string
		var seq, pos int64
		if err := rows.Scan(&entity, &seq, &pos); err != nil {
			t.Fatal(err)
		}
		if int64(len(got[entity]))+1 != pos {
			t.Errorf("entity %s: effect %d at position %d (two applied at once)", entity, seq, pos)
		}
		got[entity] = append(got[entity], seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := make([]int64, seqs)
	for i := range want {
		want[i] = int64(i + 1)
	}
	bad := 0
	for i := range entities {
		entity := orderEntity(i)
		if !slices.Equal(got[entity], want) {
			if bad++; bad <= 10 {
				t.Errorf("entity %s: effects applied in the order %v, want 1..%d once each", entity, got[entity], seqs)
			}
		}
	}
	if len(got) != entities {
		t.Errorf("effects of %d entities, want %d", len(got), entities)
	}
}

func orderEntity(i int) string { return "entity-" + strconv.Itoa(i) }

// orderedMessage is sequence seq of entity i: its key, its ordering
// headers, its body "entity:seq".
func orderedMessage(i, seq int) Message {
	entity := orderEntity(i)
	return Message{
		Key: fmt.Sprintf("%s-seq-%d", entity, seq),
		Headers: map[string]string{
			adapter.OrderKeyHeader: entity,
			adapter.OrderSeqHeader: adapter.FormatOrderSeq(int64(seq)),
		},
		Body: []byte(entity + ":" + strconv.Itoa(seq)),
	}
}

// orderedEnv is a scenario whose Middleware is created WithOrdering, its
// Release writing the audit as the handler does. It returns nil (the
// scenario is done) when the adapter refuses it, having checked the
// refusal.
func (s *suite) orderedEnv(t *testing.T) (*env, *orderAudit) {
	var a *orderAudit
	e := s.newEnv(t, idempotent.WithOrdering(idempotent.Ordering{
		Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			return a.record(ctx, tx, p.Payload)
		},
	}))
	if s.f.RefusesOrdering {
		cfg := e.config()
		cfg.Observer = adapter.ObserverFunc(func(context.Context, adapter.Event) {})
		c, err := e.tr.NewConsumer(cfg)
		if err == nil {
			_ = c.Stop(context.Background())
			t.Fatal("Features.RefusesOrdering, but NewConsumer accepted a Middleware created WithOrdering")
		}
		t.Logf("refused: %v", err)
		return nil, nil
	}
	e.ensureSchema()
	a = newOrderAudit(e)
	return e, a
}

// orderedConfig is the consumer of the ordered scenarios: four workers,
// batches of up to 10 in batch mode, the audit as the effect.
func (e *env) orderedConfig(a *orderAudit) ConsumerConfig {
	cfg := e.config()
	cfg.Workers = 4
	cfg.Handler = func(ctx context.Context, tx *sql.Tx, body []byte) error { return a.record(ctx, tx, body) }
	cfg.BatchHandler = func(ctx context.Context, tx *sql.Tx, bodies [][]byte) error {
		for _, b := range bodies {
			if err := a.record(ctx, tx, b); err != nil {
				return err
			}
		}
		return nil
	}
	return cfg
}

// orderedShuffled: every sequence of many entities published shuffled,
// 30% of them re-sent, a tenth of the first acks lost after the commit
// (Features.LoseAck: a crash between commit and ack), to two consumers of
// four workers (four consumers at full size, OrderedFullEnv): every
// entity's effects apply once each, in sequence order, and nothing is left
// parked.
func (s *suite) orderedShuffled(t *testing.T) {
	e, a := s.orderedEnv(t)
	if e == nil {
		return
	}
	entities, seqs, consumers, within := 20, 5, 2, waitWithin
	if os.Getenv(OrderedFullEnv) == "1" {
		entities, seqs, consumers, within = 2000, 20, 4, 30*time.Minute
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var msgs []Message
	for i := range entities {
		for seq := 1; seq <= seqs; seq++ {
			m := orderedMessage(i, seq)
			msgs = append(msgs, m)
			if rng.IntN(10) < 3 {
				msgs = append(msgs, m)
			}
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	var lostMu sync.Mutex
	lost := map[string]bool{}
	for range consumers {
		cfg := e.orderedConfig(a)
		if s.f.LoseAck {
			cfg.LoseAck = func(key string) bool {
				lostMu.Lock()
				defer lostMu.Unlock()
				if lost[key] || rand.IntN(10) != 0 {
					return false
				}
				lost[key] = true
				return true
			}
		}
		e.start(cfg)
	}
	start := time.Now()
	e.publishAll(msgs)
	want := entities * seqs
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for a.count(t) < want {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %d of %d effects applied", within, a.count(t), want)
		}
		<-tick.C
	}
	took := time.Since(start)
	e.stopAll()
	a.check(t, entities, seqs)
	waiting, err := e.mw.Waiting(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(waiting) != 0 {
		t.Errorf("%d entities left parked, such as %+v", len(waiting), waiting[0])
	}
	applied, parked, dups := e.outcomes()
	lostMu.Lock()
	t.Logf("%d entities × %d sequences, %d deliveries published (%d re-sent), %d acks lost, %d consumers: %d applied, %d parked, %d duplicates; all applied in %v",
		entities, seqs, len(msgs), len(msgs)-want, len(lost), consumers, applied, parked, dups, took.Round(time.Millisecond))
	lostMu.Unlock()
}

// orderedInOrder: the messages of many entities published in sequence
// order, interleaved, to one consumer of four workers that take deliveries
// by ordering key: none has to park.
func (s *suite) orderedInOrder(t *testing.T) {
	e, a := s.orderedEnv(t)
	const entities, seqs = 12, 6
	e.start(e.orderedConfig(a))
	var msgs []Message
	for seq := 1; seq <= seqs; seq++ {
		for i := range entities {
			msgs = append(msgs, orderedMessage(i, seq))
		}
	}
	e.publishAll(msgs)
	e.waitFor(fmt.Sprintf("%d effects", entities*seqs), func() bool { return a.count(t) == entities*seqs })
	e.stopAll()
	a.check(t, entities, seqs)
	if applied, parked, _ := e.outcomes(); parked != 0 {
		t.Errorf("%d messages parked (%d applied): one entity's deliveries ran on several workers at once", parked, applied)
	}
}

// publishAll publishes msgs, in order, from one goroutine.
func (e *env) publishAll(msgs []Message) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for _, m := range msgs {
		if err := e.tr.Publish(ctx, m); err != nil {
			e.t.Fatalf("Publish %s: %v", m.Key, err)
		}
	}
}

// outcomes counts the Middleware's outcomes over every key.
func (e *env) outcomes() (applied, parked, duplicates int) {
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	for _, outs := range e.rec.outcomes {
		for _, o := range outs {
			switch o {
			case idempotent.Applied:
				applied++
			case idempotent.Parked:
				parked++
			case idempotent.Duplicate:
				duplicates++
			}
		}
	}
	return applied, parked, duplicates
}
