package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/tests/internal/patroni"
)

// The Patroni tests run etcd and a three-member Patroni cluster of their
// own (tests/internal/patroni: throwaway PostgreSQL data directories on
// free loopback ports, never the shared server) and let Patroni decide the
// failover: the tests kill a leader and wait for Patroni to elect another,
// polling its REST API. The consumers find the new leader by themselves,
// through a multi-host connection string with
// target_session_attrs=read-write (lib/pq v1.12 and pgx both read it).
// Starting a cluster takes 30 s to a few minutes on a loaded machine, so
// they run only with IDEMPOTENT_PATRONI=1 (.ci/run's Patroni lane).

// patroniCluster starts a cluster, skipping the test unless
// IDEMPOTENT_PATRONI=1, and stops it in Cleanup.
func patroniCluster(t *testing.T, sync bool) *patroni.Cluster {
	t.Helper()
	if os.Getenv("IDEMPOTENT_PATRONI") != "1" {
		t.Skip("Patroni cluster tests run with IDEMPOTENT_PATRONI=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := patroni.Start(ctx, patroni.Options{Parent: os.Getenv("IDEMPOTENT_PATRONI_DIR"), Synchronous: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs())
		}
		c.Stop()
	})
	t.Logf("Patroni cluster (synchronous mode %t) started in %v", sync, time.Since(start).Round(100*time.Millisecond))
	return c
}

// patroniConsumer opens a guarded pool on dsn through drv and returns a
// Middleware on it whose retry policy outlasts a failover: Patroni takes
// up to its ttl (20 s) plus a loop to elect a leader after a member dies.
func patroniConsumer(t *testing.T, drv, dsn string, obs idempotent.Observer) (*idempotent.Middleware, *sql.DB) {
	t.Helper()
	db := sql.OpenDB(idempotent.GuardConnector(connector(t, drv, dsn)))
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, postgres.New(), "patroni",
		idempotent.WithObserver(obs),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	return mw, db
}

// patroniSetup creates the ledger and the claim table on the leader.
func patroniSetup(t *testing.T, c *patroni.Cluster) {
	t.Helper()
	db, err := sql.Open("postgres", c.DSN("patroni-setup"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "patroni")
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// patroniKill is one way of killing the leader.
type patroniKill struct {
	name string
	kill func(m *patroni.Member, ctx context.Context) error
}

var patroniKills = []patroniKill{
	{"SIGKILL of the leader's postmaster", (*patroni.Member).KillPostmaster},
	{"SIGKILL of the whole leader member (Patroni and PostgreSQL)", (*patroni.Member).Kill},
}

// patroniFailoverRun delivers keys messages twice each through consumers
// on both drivers (4 workers each) on the cluster's multi-host DSN, kills
// the leader each way of patroniKills in turn once enough messages are
// acked, waits each time for Patroni to elect another leader and for the
// killed member to rejoin as a standby, and audits the ledger on the final
// leader.
func patroniFailoverRun(t *testing.T, c *patroni.Cluster, keys int) (failoverAudit, *recorder, *failoverLoad) {
	t.Helper()
	patroniSetup(t, c)
	rec := &recorder{}
	load := newFailoverLoad(keys, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// Each kill fires after its share of the acks.
	triggers := make([]chan struct{}, len(patroniKills))
	var onces [2]sync.Once
	for i := range triggers {
		triggers[i] = make(chan struct{})
	}
	load.onAck = func(acks, _ int64) {
		for i := range triggers {
			if acks >= int64((i+1)*2*keys/(len(triggers)+1)) {
				onces[i].Do(func() { close(triggers[i]) })
			}
		}
	}
	orchestrated := make(chan struct{})
	go func() {
		defer close(orchestrated)
		for i, k := range patroniKills {
			select {
			case <-triggers[i]:
			case <-ctx.Done():
				return
			}
			leader, err := c.Leader(ctx)
			if err != nil {
				t.Error(err)
				cancel()
				return
			}
			start := time.Now()
			if err := k.kill(leader, ctx); err != nil {
				t.Error(err)
				cancel()
				return
			}
			load.killed.Store(true)
			next, err := c.WaitLeader(ctx, leader.Name)
			if err != nil {
				t.Error(err)
				cancel()
				return
			}
			elected := time.Since(start)
			// One failure at a time: the killed member comes back (a
			// whole member is restarted; Patroni restarts a postmaster by
			// itself) and rejoins as a standby, rewound onto the new
			// timeline, before the next kill. Patroni 3.0.2 compares WAL
			// positions across timelines: a crashed old primary not yet
			// rewound looks ahead of the synchronous standby, and a second
			// leader failure then leaves the cluster without a leader.
			if !leader.Running() {
				if err := leader.Start(); err != nil {
					t.Error(err)
					cancel()
					return
				}
			}
			if _, err := c.Ready(ctx); err != nil {
				t.Errorf("%s did not rejoin: %v", leader.Name, err)
				cancel()
				return
			}
			t.Logf("%s (%s): Patroni elected %s in %v; %s rejoined as a standby %v later",
				k.name, leader.Name, next.Name, elected.Round(100*time.Millisecond), leader.Name, (time.Since(start) - elected).Round(100*time.Millisecond))
		}
	}()
	var wg sync.WaitGroup
	for _, drv := range drivers {
		mw, _ := patroniConsumer(t, drv, c.DSN("patroni-"+drv), rec)
		wg.Add(1)
		go func() { defer wg.Done(); load.run(ctx, 4, mw) }()
	}
	wg.Wait()
	<-orchestrated
	if ctx.Err() != nil {
		t.Fatalf("the load did not finish: %v (last error: %v)", ctx.Err(), load.lastError.Load())
	}
	leader, err := c.Ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	audit, err := sql.Open("postgres", leader.DSN("patroni-audit"))
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	return load.audit(t, audit), rec, load
}

// TestPatroniSynchronousFailoverIsExact: with Patroni's synchronous mode
// (strict), a commit returns once the synchronous standby has flushed it,
// and Patroni promotes only that standby. The leader is killed twice while
// consumers on both drivers run — its postmaster alone, then the whole
// member — and every message has its effect exactly once on the final
// leader; none is lost, none doubled.
func TestPatroniSynchronousFailoverIsExact(t *testing.T) {
	c := patroniCluster(t, true)
	keys := patroniKeys()
	a, rec, load := patroniFailoverRun(t, c, keys)
	retries := connectionRetries(rec)
	t.Logf("Patroni synchronous failover (lib/pq and pgx, 2 leader kills): acked %d, applied %d, exactly once %d, lost %d, doubled %d; %d connection retries (codes %v), %d deliveries redelivered",
		a.acked, a.applied, a.exact, a.lost, a.doubled, retries, codeCounts(rec), load.errs.Load())
	if a.acked != keys || a.exact != keys || a.lost != 0 || a.doubled != 0 {
		t.Errorf("audit: acked %d, exactly once %d, lost %d, doubled %d; want all %d exactly once", a.acked, a.exact, a.lost, a.doubled, keys)
	}
	if a.applied > keys {
		t.Errorf("Applied returned %d times for %d messages", a.applied, keys)
	}
	if retries == 0 {
		t.Errorf("no transaction was retried across two failovers (last error: %v)", load.lastError.Load())
	}
}

// TestPatroniAsynchronousFailoverLosesNothingTwice: without synchronous
// mode a commit returns before any standby has it; Patroni promotes a
// standby within maximum_lag_on_failover (1 MiB here), and what the old
// leader committed beyond the standby's position is gone — claim and
// effect together, after the consumer acked. The test measures what is
// lost (often nothing on loopback, where the lag is tiny) and requires
// that nothing is doubled: no delivery applies twice.
func TestPatroniAsynchronousFailoverLosesNothingTwice(t *testing.T) {
	c := patroniCluster(t, false)
	keys := patroniKeys()
	a, rec, load := patroniFailoverRun(t, c, keys)
	// Applied returned more often than there are messages: a commit the
	// old leader acknowledged was lost with it, and the message's second
	// copy, still queued, applied it again on the new leader — by luck.
	t.Logf("Patroni asynchronous failover (lib/pq and pgx, 2 leader kills): acked %d, applied %d, exactly once %d, lost %d, doubled %d, acknowledged commits lost and re-applied by a second copy %d; %d connection retries, %d deliveries redelivered",
		a.acked, a.applied, a.exact, a.lost, a.doubled, max(0, a.applied-keys), connectionRetries(rec), load.errs.Load())
	if a.doubled != 0 {
		t.Errorf("%d messages have their effect more than once", a.doubled)
	}
	if a.acked != keys || a.exact+a.lost != keys {
		t.Errorf("audit: acked %d, exactly once %d, lost %d of %d", a.acked, a.exact, a.lost, keys)
	}
}

// TestPatroniStandbyIsRetried points each driver's pool at one standby
// alone, as a virtual IP or DNS name does while it still names the old
// address, and has Patroni switch over to that standby while messages are
// processed: the standby's refusals (pgx: the claim's 25006; lib/pq: 0A000
// at BEGIN READ WRITE) are retried, and once the standby is promoted every
// message applies once. None fails.
func TestPatroniStandbyIsRetried(t *testing.T) {
	c := patroniCluster(t, false)
	patroniSetup(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	want := map[string]string{"pq": "0A000", "pgx": "25006"}
	const messages = 20
	for di, drv := range drivers {
		leader, err := c.Ready(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var standby *patroni.Member
		for _, m := range c.Members {
			if m != leader {
				standby = m
				break
			}
		}
		// The switchover starts once the standby has refused a transaction.
		refused := make(chan struct{})
		rec := &recorder{}
		mw, _ := patroniConsumer(t, drv, standby.DSN("patroni-standby-"+drv), &firstRetry{recorder: rec, ch: refused})
		switched := make(chan error, 1)
		go func() {
			select {
			case <-refused:
			case <-ctx.Done():
				switched <- ctx.Err()
				return
			}
			switched <- c.Switchover(ctx, leader, standby)
		}()
		for i := range messages {
			k := 100000*(di+1) + i
			out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("standby:%d", k)}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO ledger (order_id) VALUES ($1)", k)
				return err
			})
			if err != nil {
				t.Fatalf("%s: message %d on a standby failed: %v", drv, i, err)
			}
			if out != idempotent.Applied {
				t.Fatalf("%s: message %d: %v, want Applied", drv, i, out)
			}
		}
		if err := <-switched; err != nil {
			t.Fatal(err)
		}
		codes := codeCounts(rec)
		t.Logf("%s on standby %s, switched over from %s: %d messages applied; retries by code %v", drv, standby.Name, leader.Name, messages, codes)
		if codes[want[drv]] == 0 {
			t.Errorf("%s: no retry with code %s; retries by code %v", drv, want[drv], codes)
		}
		for _, r := range rec.retryReasons() {
			if r != "connection" {
				t.Errorf("%s: a retry for %q, want connection", drv, r)
			}
		}
		var n, distinct int
		db, err := sql.Open("postgres", standby.DSN("patroni-audit"))
		if err != nil {
			t.Fatal(err)
		}
		err = db.QueryRow("SELECT count(*), count(DISTINCT order_id) FROM ledger WHERE order_id BETWEEN $1 AND $2",
			100000*(di+1), 100000*(di+1)+messages-1).Scan(&n, &distinct)
		_ = db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if n != messages || distinct != messages {
			t.Errorf("%s: %d ledger rows for %d distinct messages, want %d once each", drv, n, distinct, messages)
		}
	}
}

// codeCounts counts the recorded retries by code ("" for a transport
// failure).
func codeCounts(r *recorder) map[string]int {
	m := map[string]int{}
	for _, c := range r.retryCodes() {
		m[c]++
	}
	return m
}

// patroniKeys is the number of messages a failover run delivers (twice
// each): IDEMPOTENT_PATRONI_KEYS, default 3,000.
func patroniKeys() int {
	n := 3000
	if v := os.Getenv("IDEMPOTENT_PATRONI_KEYS"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 30 {
			panic("IDEMPOTENT_PATRONI_KEYS must be a number of at least 30, got " + v)
		}
	}
	return n
}

// firstRetry is a recorder that closes ch at the first retry.
type firstRetry struct {
	*recorder
	once sync.Once
	ch   chan struct{}
}

func (f *firstRetry) Retry(ctx context.Context, e idempotent.RetryEvent) {
	f.recorder.Retry(ctx, e)
	f.once.Do(func() { close(f.ch) })
}
