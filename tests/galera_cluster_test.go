package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/dialect/dialecttest"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/tests/internal/galera"
)

// galeraOrSkip skips unless IDEMPOTENT_GALERA=1 (starting the cluster
// takes minutes): .ci/run's Galera lane sets it.
func galeraOrSkip(t *testing.T) {
	t.Helper()
	if testing.Short() || os.Getenv("IDEMPOTENT_GALERA") != "1" {
		t.Skip("galera: set IDEMPOTENT_GALERA=1 to start a three-node cluster (2-4 minutes; .ci/run's Galera lane does)")
	}
}

// sharedGalera is the three-node cluster the Galera tests share: started
// by the first of them that runs and stopped after the package's tests
// (stopSharedGalera, from TestMain), so that a run pays for one start (2-4
// minutes on a loaded machine) instead of one a test. Each test works in
// databases of its own; TestGaleraNodeKilledMidRun kills node 3 and
// returns once it has rejoined and the three nodes are Synced again.
var sharedGalera struct {
	once sync.Once
	c    *galera.Cluster
	err  error
}

// startGalera returns the shared cluster, starting it on first use (ctx
// bounds the start); it skips where MariaDB's Galera provider cannot be
// had, except under CI.
func startGalera(t *testing.T, ctx context.Context) *galera.Cluster {
	t.Helper()
	if v := os.Getenv("IDEMPOTENT_GALERA_PORTS"); v != "" {
		// A cluster already running (three SQL ports, comma-separated), to
		// run the tests again without starting one each time.
		var ports []int
		for _, f := range strings.Split(v, ",") {
			p, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("IDEMPOTENT_GALERA_PORTS=%q: %v", v, err)
			}
			ports = append(ports, p)
		}
		if len(ports) != 3 {
			t.Fatalf("IDEMPOTENT_GALERA_PORTS=%q: want three ports", v)
		}
		return galera.Attach(ports...)
	}
	sharedGalera.once.Do(func() {
		started := time.Now()
		sharedGalera.c, sharedGalera.err = galera.Start(ctx, "")
		if sharedGalera.err == nil {
			t.Logf("three nodes Synced in %v (the cluster the Galera tests share)", time.Since(started).Round(time.Second))
		}
	})
	err := sharedGalera.err
	if errors.Is(err, galera.ErrNoGalera) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sharedGalera.c
}

// stopSharedGalera stops the shared cluster, if a test started it.
func stopSharedGalera() {
	if sharedGalera.c != nil {
		sharedGalera.c.Stop()
	}
}

// galeraDB opens database db on node i of c, with causal reads
// (wsrep_sync_wait = 1: a read first waits for the node to apply every
// write set the cluster committed before it), closed at the end.
func galeraDB(t testing.TB, c *galera.Cluster, i int, db string, maxConns int) *sql.DB {
	t.Helper()
	d, err := sql.Open("mysql", c.Nodes[i].DSN(db)+"?wsrep_sync_wait=1")
	if err != nil {
		t.Fatal(err)
	}
	d.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// retryCodes counts the retries of each error code.
type retryCodes struct {
	mu    sync.Mutex
	codes map[string]int
}

func (r *retryCodes) Outcome(context.Context, idempotent.Event) {}

func (r *retryCodes) Retry(_ context.Context, e idempotent.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.codes == nil {
		r.codes = map[string]int{}
	}
	r.codes[e.Code]++
}

func (r *retryCodes) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.codes)
}

// TestGaleraUpkeep runs the claim table's upkeep on a three-node cluster:
// EnsureSchema of a table partitioned by day on node 1 (DDL under total
// order isolation), found complete on nodes 2 and 3, and MaintainPartitions
// from node 2; the cleanup of a plain table from all three nodes at once,
// which deletes every expired claim exactly once between them; and the
// cleanup row that makes two cleanup batches on two nodes certify against
// each other even when they clean different consumers: the second to
// commit fails with 1213, where GET_LOCK alone, node-local on Galera, would
// let both commit at once.
func TestGaleraUpkeep(t *testing.T) {
	galeraOrSkip(t)
	heavy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startGalera(t, ctx)
	admin := galeraDB(t, c, 0, "", 2)
	name := uniqueName("upkeep")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	dbs := make([]*sql.DB, 3)
	for i := range dbs {
		dbs[i] = galeraDB(t, c, i, name, 4)
	}
	retry := idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 50, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})

	t.Run("Partitions", func(t *testing.T) {
		for i, db := range dbs {
			mw, err := idempotent.New(db, mysql.New(), "days", idempotent.WithTable("days"), idempotent.WithRetention(48*time.Hour), idempotent.WithDailyPartitions(2), retry)
			if err != nil {
				t.Fatal(err)
			}
			if err := mw.EnsureSchema(ctx); err != nil {
				t.Fatalf("EnsureSchema on node %d: %v", i+1, err)
			}
		}
		mw, err := idempotent.New(dbs[1], mysql.New(), "days", idempotent.WithTable("days"), idempotent.WithRetention(48*time.Hour), idempotent.WithDailyPartitions(2), retry)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mw.ClaimTable().MaintainPartitions(ctx); err != nil {
			t.Fatalf("MaintainPartitions on node 2: %v", err)
		}
		want, err := mw.ClaimTable().Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 {
			t.Fatal("no partitions after MaintainPartitions")
		}
		for i, db := range dbs {
			m, err := idempotent.New(db, mysql.New(), "days", idempotent.WithTable("days"), idempotent.WithRetention(48*time.Hour), idempotent.WithDailyPartitions(2))
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.ClaimTable().Partitions(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Errorf("node %d sees %d partitions, node 2 made %d", i+1, len(got), len(want))
			}
			at := time.Now()
			if out, err := m.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("k-%d", i), EventTime: at}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
				t.Errorf("claim on node %d in today's partition: %v %v", i+1, out, err)
			}
		}
	})

	t.Run("CleanupFromEveryNode", func(t *testing.T) {
		const consumers, perConsumer = 3, 600
		obs := &retryCodes{}
		mws := make([]*idempotent.Middleware, 3)
		for i, db := range dbs {
			var err error
			mws[i], err = idempotent.New(db, mysql.New(), "c0", idempotent.WithTable("plain"), idempotent.WithObserver(obs), retry)
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := mws[0].EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		for k := range consumers {
			var vals []string
			for i := range perConsumer {
				vals = append(vals, fmt.Sprintf("('c%d', 'key-%d', UTC_TIMESTAMP(6) - INTERVAL 60 DAY)", k, i))
			}
			if _, err := dbs[k].ExecContext(ctx, "INSERT INTO plain (consumer, message_key, processed_at) VALUES "+strings.Join(vals, ",")); err != nil {
				t.Fatal(err)
			}
		}
		var deleted [3]int64
		var errs [3]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		opts := idempotent.DefaultCleanupOptions()
		opts.BatchSize = 50
		opts.MinBatchSize = 10
		for i := range 3 {
			wg.Go(func() {
				<-start
				deleted[i], errs[i] = mws[i].ClaimTable().Cleanup(ctx, opts)
			})
		}
		close(start)
		wg.Wait()
		var sum int64
		for i := range 3 {
			if errs[i] != nil && !errors.Is(errs[i], idempotent.ErrCleanupBusy) {
				t.Errorf("cleanup on node %d: %v", i+1, errs[i])
			}
			sum += deleted[i]
		}
		var left int64
		if err := dbs[2].QueryRowContext(ctx, "SELECT COUNT(*) FROM plain").Scan(&left); err != nil {
			t.Fatal(err)
		}
		t.Logf("cleanups on three nodes at once deleted %v (%d in all) of %d claims, %d left; retries by code %v", deleted, sum, consumers*perConsumer, left, obs)
		if sum != consumers*perConsumer || left != 0 {
			t.Errorf("deleted %d in all and %d left, want %d and 0", sum, left, consumers*perConsumer)
		}
	})

	t.Run("CleanupRowCertifies", func(t *testing.T) {
		d := mysql.New()
		tbl, err := dialect.ParseTable("plain")
		if err != nil {
			t.Fatal(err)
		}
		// The start of a batch of consumer c1's cleanup on node 1 and of
		// c2's on node 2, both open at once: the cleanup lock, granted on
		// each node, and the horizon raise of each batch's own consumer,
		// different rows but for the cleanup row they both move.
		txs := make([]*sql.Tx, 2)
		for k, db := range dbs[:2] {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			consumer := "c" + strconv.Itoa(k+1)
			cutoff := time.Now().Add(-30 * 24 * time.Hour)
			var got bool
			lock, largs := d.CleanupLockSQL(tbl)
			if err := tx.QueryRowContext(ctx, lock, largs...).Scan(&got); err != nil || !got {
				t.Fatalf("node %d: cleanup lock: %v %v (GET_LOCK is node-local: each node grants it)", k+1, got, err)
			}
			adv, aargs := d.AdvanceHorizonSQL(tbl, consumer, cutoff)
			if _, err := tx.ExecContext(ctx, adv, aargs...); err != nil {
				t.Fatal(err)
			}
			txs[k] = tx
		}
		if err := txs[0].Commit(); err != nil {
			t.Fatalf("first batch: %v", err)
		}
		err = txs[1].Commit()
		if err == nil {
			t.Fatal("two cleanup batches on two nodes both committed: the cleanup row did not make them certify against each other")
		}
		if c := d.Classify(err); c.Kind != dialect.KindSerialization {
			t.Fatalf("second batch: %v, classified %+v; want a retryable certification failure", err, c)
		}
		t.Logf("the second batch, on node 2: %v", err)
	})
}

// TestGaleraNodeKilledMidRun is the Galera soak: workers on all three
// nodes deliver new keys, a quarter of them twice, for
// IDEMPOTENT_GALERA_SOAK (a duration, default 60 s). A third of the way
// through, node 3 is killed (SIGKILL): its workers' deliveries fail and are
// delivered again, on any node, while it rejoins (state transfer) and then
// takes work again; the run goes on past its duration until node 3 has
// settled deliveries since rejoining. Then the deliveries in flight settle
// and the audit is exact: one effect and one claim per key; a delivery
// whose COMMIT landed as the node died, its answer lost, is Duplicate on
// its redelivery.
func TestGaleraNodeKilledMidRun(t *testing.T) {
	galeraOrSkip(t)
	heavy(t)
	dur := 60 * time.Second
	if v := os.Getenv("IDEMPOTENT_GALERA_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("IDEMPOTENT_GALERA_SOAK=%q: want a positive duration such as 10m", v)
		}
		dur = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+20*time.Minute)
	defer cancel()
	c := startGalera(t, ctx)
	admin := galeraDB(t, c, 0, "", 2)
	name := uniqueName("soak")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+name+".effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL, node INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	obs := &retryCodes{}
	mws := make([]*idempotent.Middleware, 3)
	for i := range mws {
		db, err := sql.Open("mysql", c.Nodes[i].DSN(name)+"?timeout=2s")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { _ = db.Close() })
		mws[i], err = idempotent.New(db, mysql.New(), "soak", idempotent.WithObserver(obs),
			idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := mws[0].EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}

	// New deliveries come from feed until the run ends (every fourth key
	// twice in a row, so that both copies are often in flight at once);
	// failed ones go to again, which the workers take first.
	feed := make(chan string)
	again := make(chan string, 64) // at most one a worker waits there
	endFeed := make(chan struct{})
	var keys, total int64 // written by the feeder, read after it ended
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		defer close(feed)
		for i := int64(0); ; i++ {
			k := fmt.Sprintf("order-%d", i)
			copies := 1
			if i%4 == 0 {
				copies = 2
			}
			for c := range copies {
				select {
				case feed <- k:
					total++
				case <-endFeed:
					keys = i
					if c > 0 { // k's first copy went out
						keys++
					}
					return
				}
			}
		}
	}()
	var settled, applied, duplicate, failed atomic.Int64
	var settledOn [3]atomic.Int64
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	for w := range 6 {
		node := w % 3
		wg.Go(func() {
			in := feed
			for {
				var k string
				select {
				case k = <-again:
				default:
					var ok bool
					select {
					case k = <-again:
					case k, ok = <-in:
						if !ok {
							in = nil
							continue
						}
					case <-runCtx.Done():
						return
					}
				}
				out, err := mws[node].ProcessMessage(runCtx, idempotent.Message{Key: k}, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO effects (k, node) VALUES (?, ?)", k, node+1)
					return err
				})
				if err != nil {
					if runCtx.Err() != nil {
						return
					}
					failed.Add(1)
					again <- k // delivered again, to any worker
					continue
				}
				if out == idempotent.Applied {
					applied.Add(1)
				} else {
					duplicate.Add(1)
				}
				settled.Add(1)
				settledOn[node].Add(1)
			}
		})
	}
	began := time.Now()
	select { // the fault's schedule, not a synchronisation
	case <-time.After(dur / 3):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	killedAt := settled.Load()
	rejoinStart := time.Now()
	if err := c.Rejoin(ctx, 2); err != nil {
		t.Fatal(err)
	}
	rejoined := time.Since(rejoinStart).Round(time.Second)
	onNode3 := settledOn[2].Load()
	// The feed runs for the duration and until node 3 has settled 50
	// deliveries since it rejoined; then what was fed settles.
	for time.Since(began) < dur || settledOn[2].Load() < onNode3+50 {
		select {
		case <-ctx.Done():
			t.Fatalf("node 3 settled %d deliveries since it rejoined", settledOn[2].Load()-onNode3)
		case <-time.After(50 * time.Millisecond): // polling interval, not synchronisation
		}
	}
	close(endFeed)
	<-fed
	for settled.Load() < total {
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d deliveries settled", settled.Load(), total)
		case <-time.After(50 * time.Millisecond): // polling interval, not synchronisation
		}
	}
	ran := time.Since(began).Round(time.Second)
	stop()
	wg.Wait()

	check := galeraDB(t, c, 2, name, 1)
	var rows, distinct, claims int64
	if err := check.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT k) FROM effects").Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := check.QueryRowContext(ctx, "SELECT COUNT(*) FROM processed_messages WHERE consumer = 'soak'").Scan(&claims); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: %d deliveries of %d keys on three nodes, node 3 killed after %d settled and Synced again %v later, then settled %d; %d applied, %d duplicate, %d failed and delivered again; audit (on node 3): %d effects of %d keys, %d claims; retries by code %v",
		ran, total, keys, killedAt, rejoined, settledOn[2].Load()-onNode3, applied.Load(), duplicate.Load(), failed.Load(), rows, distinct, claims, obs)
	// A COMMIT in flight when the node died may have committed with its
	// answer lost: its redelivery finds the claim and reports Duplicate.
	// So the outcomes add up, and the effects and claims are exact.
	if rows != keys || distinct != keys || claims != keys || applied.Load()+duplicate.Load() != total || applied.Load() > keys {
		t.Fatalf("%d effects of %d keys, %d claims, %d applied + %d duplicate; want %d, %d, %d and %d deliveries settled, at most %d applied", rows, distinct, claims, applied.Load(), duplicate.Load(), keys, keys, keys, total, keys)
	}
}

// TestGaleraConformance runs the dialect conformance suite
// (dialecttest.Run) against node 2 of a three-node cluster: every statement
// of the suite is replicated to the other two nodes and certified, its DDL
// under total order isolation.
func TestGaleraConformance(t *testing.T) {
	galeraOrSkip(t)
	heavy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startGalera(t, ctx)
	admin := galeraDB(t, c, 0, "", 2)
	name := uniqueName("conformance")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	dialecttest.Run(t, dialecttest.Harness{
		Dialect:          mysql.New(),
		Open:             func(testing.TB) (*sql.DB, error) { return sql.Open("mysql", c.Nodes[1].DSN(name)) },
		OpenGuarded:      func(testing.TB) (*sql.DB, error) { return idempotent.OpenGuarded("mysql", c.Nodes[1].DSN(name)) },
		Table:            func(testing.TB, *sql.DB) string { return uniqueName("t") },
		MaxConns:         12,
		KillSession:      func(t testing.TB, tx *sql.Tx, _ *sql.DB) { killGalera(t, c, name, tx) },
		LockTimeoutQuery: "SELECT @@SESSION.innodb_lock_wait_timeout",
		ProcessedAt:      mysqlProcessedAt,
		Provokers: []dialecttest.Provoker{
			{Name: "undefined table", Want: dialect.KindUndefinedTable, Provoke: missingTableInsert("?")},
		},
	})
}

// killGalera kills tx's session on the node it is connected to.
func killGalera(t testing.TB, c *galera.Cluster, db string, tx *sql.Tx) {
	t.Helper()
	var id int64
	var port int
	if err := tx.QueryRow("SELECT CONNECTION_ID(), @@port").Scan(&id, &port); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.Nodes {
		if n.Port != port {
			continue
		}
		admin := galeraDB(t, c, i, db, 1)
		if _, err := admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			t.Fatal(err)
		}
		waitGone(t, admin, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id)
		return
	}
	t.Fatalf("no node answers on port %d", port)
}
