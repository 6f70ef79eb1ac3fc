package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/tests/internal/galera"
)

// spreadConnector opens each new connection of a pool on the next node of
// a cluster in turn, so a pool of several connections holds some on every
// node and its transactions land on any of them, as behind a load
// balancer that spreads connections.
type spreadConnector struct {
	nodes []driver.Connector
	next  atomic.Uint64
}

func (s *spreadConnector) Connect(ctx context.Context) (driver.Conn, error) {
	return s.nodes[(s.next.Add(1)-1)%uint64(len(s.nodes))].Connect(ctx)
}

func (s *spreadConnector) Driver() driver.Driver { return s.nodes[0].Driver() }

// galeraSpreadDB opens database db through a pool of maxConns connections
// spread over every node of c (no causal reads), closed at the end.
func galeraSpreadDB(t testing.TB, c *galera.Cluster, db string, maxConns int) *sql.DB {
	t.Helper()
	s := &spreadConnector{}
	for _, n := range c.Nodes {
		cfg, err := gomysql.ParseDSN(n.DSN(db))
		if err != nil {
			t.Fatal(err)
		}
		cfg.InterpolateParams = os.Getenv("IDEMPOTENT_GALERA_PREPARED") != "1"
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.nodes = append(s.nodes, conn)
	}
	d := sql.OpenDB(s)
	d.SetMaxOpenConns(maxConns)
	d.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// galeraCaughtUp returns once every node of c has applied what the cluster
// committed before (a causal read on each): DDL too, which a node applies
// after the one that ran it has returned.
func galeraCaughtUp(t testing.TB, ctx context.Context, c *galera.Cluster) {
	t.Helper()
	for i := range c.Nodes {
		var one int
		if err := galeraDB(t, c, i, "", 1).QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("causal read on node %d: %v", i+1, err)
		}
	}
}

// TestGaleraOrderedShuffled runs WithOrdering on a pool whose connections
// are spread over the three nodes of a cluster: every sequence of many
// entities delivered shuffled, 30% re-sent by the producer, a tenth of the
// commits redelivered as after a lost ack, to concurrent workers, one
// message per transaction (PerMessage) and up to eight (Batch). Two
// deliveries of one entity then run on two nodes at once, each under its
// own node's lock of the entity's sequence row, which the other node does
// not see: only certification decides between them. The audit, read with
// causal reads, must find every entity's effects applied once each, in
// sequence order, and nothing left parked. IDEMPOTENT_GALERA_ORDER_ENTITIES
// sets the entities (default 300, 10 sequences each).
func TestGaleraOrderedShuffled(t *testing.T) {
	galeraOrSkip(t)
	heavy(t)
	entities := 300
	if v := os.Getenv("IDEMPOTENT_GALERA_ORDER_ENTITIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IDEMPOTENT_GALERA_ORDER_ENTITIES=%q: want a positive count", v)
		}
		entities = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := startGalera(t, ctx)
	admin := galeraDB(t, c, 0, "", 2)
	name := uniqueName("ordered")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	galeraCaughtUp(t, ctx, c)
	for _, mode := range []struct {
		name  string
		batch int
	}{{"PerMessage", 1}, {"Batch", 8}} {
		t.Run(mode.name, func(t *testing.T) {
			galeraOrderedShuffled(t, ctx, c, name, entities, mode.batch)
		})
	}
}

func galeraOrderedShuffled(t *testing.T, ctx context.Context, c *galera.Cluster, dbName string, entities, batch int) {
	const perEntity, workers = 10, 12
	table := uniqueName("t")
	check := galeraDB(t, c, 2, dbName, 2)
	if _, err := check.ExecContext(ctx, "CREATE TABLE "+table+"_audit (id BIGINT AUTO_INCREMENT PRIMARY KEY, entity VARCHAR(64) NOT NULL, seq INT NOT NULL, pos INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	// record appends (entity, seq) to the entity's effects, in the
	// effect's transaction; pos is one more than the entity's effects
	// before it.
	record := func(ctx context.Context, tx *sql.Tx, entity string, seq int64) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+table+"_audit (entity, seq, pos) SELECT ?, ?, COUNT(*) + 1 FROM "+table+"_audit WHERE entity = ?", entity, seq, entity)
		return err
	}
	obs := &retryCodes{}
	opts := []idempotent.Option{idempotent.WithTable(table), idempotent.WithObserver(obs),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 50, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			if string(p.Payload) != p.OrderKey+":"+strconv.FormatInt(p.OrderSeq, 10) {
				return fmt.Errorf("parked message %q came back as payload %q", p.Key, p.Payload)
			}
			return record(ctx, tx, p.OrderKey, p.OrderSeq)
		}})}
	// The schema from one node, with causal reads: EnsureSchema's check
	// that the tables exist, on a node still running the DDL, would not
	// find them.
	setup, err := idempotent.New(check, mysql.New(), "ordered", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	galeraCaughtUp(t, ctx, c)
	mw, err := idempotent.New(galeraSpreadDB(t, c, dbName, workers), mysql.New(), "ordered", opts...)
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(uint64(batch), 3))
	var deliveries []idempotent.Message
	for i := range entities {
		entity := fmt.Sprintf("e%d", i)
		for s := int64(1); s <= perEntity; s++ {
			m := idempotent.Message{Key: fmt.Sprintf("%s-%d", entity, s), OrderKey: entity, OrderSeq: s, Payload: []byte(entity + ":" + strconv.FormatInt(s, 10))}
			deliveries = append(deliveries, m)
			if rng.IntN(10) < 3 { // re-sent by the producer
				deliveries = append(deliveries, m)
			}
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	type delivery struct {
		msg     idempotent.Message
		crashed bool // delivered again once after a lost ack
	}
	queue := make(chan delivery, len(deliveries)*2)
	var pending sync.WaitGroup
	for _, m := range deliveries {
		pending.Add(1)
		queue <- delivery{msg: m}
	}
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
	var outcomes [4]atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wrng := rand.New(rand.NewPCG(uint64(w), 11))
		wg.Go(func() {
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
				if len(msgs) == 1 {
					var out idempotent.Outcome
					out, err = mw.ProcessMessage(ctx, msgs[0], func(ctx context.Context, tx *sql.Tx) error {
						return record(ctx, tx, msgs[0].OrderKey, msgs[0].OrderSeq)
					})
					outs = []idempotent.Outcome{out}
				} else {
					outs, err = mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
						for _, i := range fresh {
							if err := record(ctx, tx, msgs[i].OrderKey, msgs[i].OrderSeq); err != nil {
								return err
							}
						}
						return nil
					})
				}
				for i, d := range ds {
					switch {
					case err != nil:
						// Not acked: the broker delivers it again.
						failed.Add(1)
						pending.Add(1)
						queue <- d
					case !d.crashed && wrng.IntN(10) == 0:
						d.crashed = true
						pending.Add(1)
						queue <- d
						outcomes[outs[i]].Add(1)
					default:
						outcomes[outs[i]].Add(1)
					}
					pending.Done()
				}
			}
		})
	}
	pending.Wait()
	close(queue)
	wg.Wait()

	// The audit, on node 3, after it applied every write set committed
	// before the read (causal reads).
	applied := map[string][]int64{}
	rows, err := check.QueryContext(ctx, "SELECT entity, seq, pos FROM "+table+"_audit ORDER BY entity, pos, id")
	if err != nil {
		t.Fatal(err)
	}
	lastPos := map[string]int64{}
	var effects int
	for rows.Next() {
		var entity string
		var seq, pos int64
		if err := rows.Scan(&entity, &seq, &pos); err != nil {
			t.Fatal(err)
		}
		if pos == lastPos[entity] {
			t.Errorf("entity %s: two effects applied at position %d (at once)", entity, pos)
		}
		lastPos[entity] = pos
		applied[entity] = append(applied[entity], seq)
		effects++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := make([]int64, perEntity)
	for i := range want {
		want[i] = int64(i + 1)
	}
	var wrong int
	for i := range entities {
		entity := fmt.Sprintf("e%d", i)
		if got := applied[entity]; !slices.Equal(got, want) {
			if wrong++; wrong <= 10 {
				t.Errorf("entity %s: effects applied in the order %v, want %v", entity, got, want)
			}
		}
	}
	var parked, seqRows int
	if err := check.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+"_order_parked").Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if err := check.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+"_order_seq WHERE last_seq = ?", perEntity).Scan(&seqRows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d deliveries of %d entities × %d sequences over three nodes, batches of up to %d: %d applied, %d parked, %d duplicate, %d failed and delivered again; audit (node 3): %d effects, %d entities wrong, %d entities at their last sequence, %d left parked; retries by code %v",
		len(deliveries), entities, perEntity, batch, outcomes[idempotent.Applied].Load(), outcomes[idempotent.Parked].Load(), outcomes[idempotent.Duplicate].Load(), failed.Load(),
		effects, wrong, seqRows, parked, obs)
	if wrong > 0 || parked != 0 || seqRows != entities || effects != entities*perEntity {
		t.Errorf("%d entities wrong, %d messages left parked, %d of %d entities at their last sequence, %d effects for %d", wrong, parked, seqRows, entities, effects, entities*perEntity)
	}
	if outcomes[idempotent.Parked].Load() == 0 {
		t.Error("no delivery was parked: the test did not exercise parking")
	}
}
