package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// The failover tests run a primary and a streaming standby of their own
// (throwaway clusters on free loopback ports, never the shared server),
// consumers on a multi-host DSN that follows the writable node, and kill the
// primary with SIGKILL under load, then promote the standby with pg_ctl
// promote, as an orchestrator would. The audit runs on the new primary.

// failoverBin returns the PostgreSQL server binaries, skipping the test
// when there are none (failing it when CI is set).
func failoverBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("failover: skipped in -short mode")
	}
	bin, err := pgcluster.FindBin()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("failover tests need PostgreSQL server binaries and CI is set: %v", err)
		}
		t.Skipf("failover: %v", err)
	}
	return bin
}

// replicationPair is a primary, a standby streaming from it through a
// replicationLink, and the multi-host DSN that finds whichever is writable.
type replicationPair struct {
	primary, standby *pgcluster.Cluster
	link             *replicationLink
}

// newReplicationPair starts a primary with the given settings and a standby
// named "standby" streaming from it, and waits until the primary reports
// the standby streaming (and, with synchronous_standby_names, as sync).
func newReplicationPair(t *testing.T, primarySettings ...string) *replicationPair {
	t.Helper()
	bin := failoverBin(t)
	ctx := context.Background()
	parent := t.TempDir()
	primary, err := pgcluster.New(ctx, bin, pgcluster.Options{Parent: parent, Prefix: "primary-", TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Remove)
	if err := primary.Start(ctx, primarySettings...); err != nil {
		t.Fatal(err)
	}
	link := newReplicationLink(t, primary.Addr())
	standby, err := pgcluster.NewStandby(ctx, primary, pgcluster.Options{Parent: parent, Prefix: "standby-", TCP: true}, "standby", link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Remove)
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	p := &replicationPair{primary: primary, standby: standby, link: link}
	mon := p.open(t, p.primary.DSN("failover-monitor"))
	waitFor(t, "the standby to stream", func() (bool, error) {
		var n int
		err := mon.QueryRow(`SELECT count(*) FROM pg_stat_replication
			WHERE application_name = 'standby' AND state = 'streaming'
			  AND (current_setting('synchronous_standby_names') = '' OR sync_state = 'sync')`).Scan(&n)
		return n == 1, err
	})
	_ = mon.Close()
	return p
}

// open opens a plain lib/pq pool on dsn, closed in Cleanup.
func (p *replicationPair) open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// multiHostDSN lists the primary, then the standby, and asks for the
// writable one: before the failover that is the primary; after it, the
// primary refuses connections and the promoted standby accepts writes.
// lib/pq and pgx both read host and port lists and target_session_attrs.
func (p *replicationPair) multiHostDSN() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable connect_timeout=2 target_session_attrs=read-write application_name=failover-consumer",
		p.primary.Port, p.standby.Port)
}

// orchestrate fails over as an orchestrator would, once trigger closes: it
// holds one consumer's transaction open (its effect written, its COMMIT not
// yet sent), kills the primary with SIGKILL, releases that transaction
// (its COMMIT meets a dead connection), and promotes the standby with
// pg_ctl promote. The returned channel closes when it is done; on failure
// it reports with t.Errorf and cancels the load.
func (p *replicationPair) orchestrate(t *testing.T, ctx context.Context, cancel context.CancelFunc, load *failoverLoad, trigger <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, ch := range []<-chan struct{}{trigger, load.held} {
			if ch == load.held {
				load.holdNext.Store(true)
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
		load.killed.Store(true)
		start := time.Now()
		if err := p.primary.Kill(); err != nil {
			t.Errorf("kill the primary: %v", err)
			cancel()
		}
		close(load.release)
		if err := p.standby.Promote(context.Background()); err != nil {
			t.Error(err)
			cancel()
		}
		t.Logf("primary killed and standby promoted in %v", time.Since(start).Round(time.Millisecond))
	}()
	return done
}

// replicationLink is a TCP proxy between the standby's walreceiver and the
// primary. Cut closes its connections and refuses new ones: from then on
// the standby receives no more WAL, while the primary, with asynchronous
// replication, goes on committing and acknowledging.
type replicationLink struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	cut      bool
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newReplicationLink(t *testing.T, upstream string) *replicationLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &replicationLink{ln: ln, upstream: upstream}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		l.Cut()
		l.wg.Wait()
	})
	return l
}

// Addr is the link's host:port.
func (l *replicationLink) Addr() string { return l.ln.Addr().String() }

// Cut drops the replication connection and refuses the walreceiver's
// reconnections.
func (l *replicationLink) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

func (l *replicationLink) accept() {
	defer l.wg.Done()
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", l.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		l.mu.Lock()
		if l.cut {
			l.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			continue
		}
		l.conns = append(l.conns, client, server)
		l.mu.Unlock()
		l.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer l.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(server, client)
		go pipe(client, server)
	}
}

// failoverLoad is the consumer side of a failover test: a broker of its own
// (a queue that redelivers whatever was not acked), workers calling
// Process, and the bookkeeping for the audit.
type failoverLoad struct {
	keys   int
	copies int

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []int // message numbers waiting for delivery
	pending int   // deliveries not yet acked (queued or in flight)
	stopped bool  // the run's context ended

	remaining       []atomic.Int32 // per message: copies not yet acked
	appliedLate     []atomic.Bool  // per message: applied by a delivery that started after the link was cut
	acked           []atomic.Bool  // per message: at least one copy acked
	ackedBeforeKill []atomic.Bool  // per message: all copies acked before the kill
	killed          atomic.Bool
	linkCut         atomic.Bool

	acks      atomic.Int64
	applied   atomic.Int64
	errs      atomic.Int64 // deliveries that failed and went back to the queue
	lateLost  atomic.Int64 // messages certain to be lost: applied after the cut, every copy acked before the kill
	onAck     func(acks int64, lateLost int64)
	lastError atomic.Value

	// holdNext makes the next handler signal held once its effect is
	// written, and wait for release before returning: a transaction that
	// is certain to be in flight when the primary dies.
	holdNext atomic.Bool
	held     chan struct{}
	release  chan struct{}
}

func newFailoverLoad(keys, copies int) *failoverLoad {
	l := &failoverLoad{keys: keys, copies: copies,
		remaining: make([]atomic.Int32, keys), appliedLate: make([]atomic.Bool, keys),
		acked: make([]atomic.Bool, keys), ackedBeforeKill: make([]atomic.Bool, keys)}
	l.cond = sync.NewCond(&l.mu)
	l.held, l.release = make(chan struct{}), make(chan struct{})
	for k := range keys {
		l.remaining[k].Store(int32(copies))
		for range copies {
			l.queue = append(l.queue, k) // the copies of a message side by side: concurrent duplicates
		}
	}
	l.pending = len(l.queue)
	return l
}

// next returns the next delivery, or false when every delivery is acked or
// the run's context ended.
func (l *failoverLoad) next() (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.queue) == 0 || l.stopped {
		if l.pending == 0 || l.stopped {
			return 0, false
		}
		l.cond.Wait()
	}
	k := l.queue[0]
	l.queue = l.queue[1:]
	return k, true
}

// done acks a delivery, or puts it back for redelivery.
func (l *failoverLoad) done(k int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok {
		l.pending--
	} else {
		l.queue = append(l.queue, k)
	}
	l.cond.Broadcast()
}

func (l *failoverLoad) key(k int) string { return fmt.Sprintf("order:%d", k) }

// run delivers every message with the given number of workers through mw;
// the effect is one ledger row per applied message.
func (l *failoverLoad) run(ctx context.Context, workers int, mw *idempotent.Middleware) {
	defer context.AfterFunc(ctx, func() {
		l.mu.Lock()
		l.stopped = true
		l.cond.Broadcast()
		l.mu.Unlock()
	})()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, ok := l.next()
				if !ok || ctx.Err() != nil {
					return
				}
				late := l.linkCut.Load()
				out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: l.key(k)}, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (order_id) VALUES ($1)", k); err != nil {
						return err
					}
					if l.holdNext.CompareAndSwap(true, false) {
						close(l.held)
						<-l.release
					}
					return nil
				})
				if err != nil {
					l.errs.Add(1)
					l.lastError.Store(err.Error())
					l.done(k, false)
					continue
				}
				// The consumer acks: the broker forgets this copy.
				l.acked[k].Store(true)
				if out == idempotent.Applied {
					l.applied.Add(1)
					if late {
						l.appliedLate[k].Store(true)
					}
				}
				lost := l.lateLost.Load()
				if l.remaining[k].Add(-1) == 0 && !l.killed.Load() {
					l.ackedBeforeKill[k].Store(true)
					if l.appliedLate[k].Load() {
						lost = l.lateLost.Add(1)
					}
				}
				n := l.acks.Add(1)
				l.done(k, true)
				if l.onAck != nil {
					l.onAck(n, lost)
				}
			}
		}()
	}
	wg.Wait()
}

// failoverAudit is what the new primary holds against what was acked.
type failoverAudit struct {
	acked, applied, exact, lost, doubled int
	certainLoss, certainLossFound        int
}

// audit reads the ledger on the new primary and compares it with the acks.
func (l *failoverLoad) audit(t *testing.T, db *sql.DB) failoverAudit {
	t.Helper()
	effects := make([]int, l.keys)
	rows, err := db.Query("SELECT order_id, count(*) FROM ledger GROUP BY order_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		effects[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	var a failoverAudit
	a.applied = int(l.applied.Load())
	for k := range l.keys {
		if !l.acked[k].Load() {
			continue
		}
		a.acked++
		switch {
		case effects[k] == 1:
			a.exact++
		case effects[k] == 0:
			a.lost++
		default:
			a.doubled++
		}
		if l.appliedLate[k].Load() && l.ackedBeforeKill[k].Load() {
			a.certainLoss++
			if effects[k] == 0 {
				a.certainLossFound++
			}
		}
	}
	return a
}

// failoverConsumer opens the consumers' pool on the multi-host DSN through
// drv, creates the ledger and the claim table on the primary, and returns
// the middleware.
func failoverConsumer(t *testing.T, p *replicationPair, drv string, obs idempotent.Observer) *idempotent.Middleware {
	t.Helper()
	db := sql.OpenDB(idempotent.GuardConnector(connector(t, drv, p.multiHostDSN())))
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { closeChecked(t, db) })
	if _, err := db.Exec("CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "failover",
		idempotent.WithObserver(obs),
		// Long enough to ride out the promotion: a lost connection is
		// retried onto the new primary once it accepts writes.
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 100, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return mw
}

// connectionRetries counts the retries the observer saw for lost
// connections.
func connectionRetries(r *recorder) int {
	n := 0
	for _, reason := range r.retryReasons() {
		if reason == "connection" {
			n++
		}
	}
	return n
}

// checkReplicationPrivileges runs CheckReplication as a role without
// pg_monitor, which sees the standby but not its sync state, and again once
// granted pg_monitor.
func checkReplicationPrivileges(t *testing.T, p *replicationPair) {
	t.Helper()
	admin := p.open(t, p.primary.DSN("failover-admin"))
	if _, err := admin.Exec("CREATE ROLE watcher LOGIN"); err != nil {
		t.Fatal(err)
	}
	watcher := p.open(t, strings.Replace(p.primary.DSN("failover-watcher"), "user=postgres", "user=watcher", 1))
	rep, err := postgres.CheckReplication(context.Background(), watcher)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.StandbysHidden || len(rep.Standbys) != 1 || rep.Err() == nil || !strings.Contains(strings.Join(rep.Warnings(), "\n"), "pg_monitor") {
		t.Fatalf("CheckReplication without pg_monitor: %+v, warnings %q", rep, rep.Warnings())
	}
	if _, err := admin.Exec("GRANT pg_monitor TO watcher"); err != nil {
		t.Fatal(err)
	}
	if rep, err = postgres.CheckReplication(context.Background(), watcher); err != nil || rep.StandbysHidden ||
		len(rep.Standbys) != 1 || rep.Standbys[0].SyncState != "async" || rep.Standbys[0].Name != "standby" {
		t.Fatalf("CheckReplication with pg_monitor: %+v, %v", rep, err)
	}
}

const (
	failoverKeys    = 600
	failoverCopies  = 2
	failoverWorkers = 8
	failoverKillAt  = 200 // acks before the primary dies
)

// TestFailoverSynchronousReplicationKeepsEveryAck: with synchronous_commit =
// on and the standby in synchronous_standby_names, a commit returns only once
// the standby has flushed it, so every acked message has its effect on the
// promoted standby, exactly once; transactions in flight when the primary
// died are retried onto the new primary.
func TestFailoverSynchronousReplicationKeepsEveryAck(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			p := newReplicationPair(t, "synchronous_standby_names=standby", "synchronous_commit=on")

			// The library's own check agrees before the failover.
			rep, err := postgres.CheckReplication(context.Background(), p.open(t, p.primary.DSN("failover-check")))
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Synchronous() {
				t.Fatalf("CheckReplication on a synchronous primary: %+v", rep)
			}

			rec := &recorder{}
			mw := failoverConsumer(t, p, drv, rec)
			load := newFailoverLoad(failoverKeys, failoverCopies)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			// The orchestrator: once enough messages are acked, hold one
			// transaction open, kill the primary under it, release it (its
			// COMMIT meets a dead connection) and promote the standby.
			reached := make(chan struct{})
			var once sync.Once
			load.onAck = func(acks, _ int64) {
				if acks >= failoverKillAt {
					once.Do(func() { close(reached) })
				}
			}
			orchestrated := p.orchestrate(t, ctx, cancel, load, reached)
			load.run(ctx, failoverWorkers, mw)
			<-orchestrated
			if ctx.Err() != nil {
				t.Fatalf("the load did not finish: %v (last error: %v)", ctx.Err(), load.lastError.Load())
			}

			a := load.audit(t, p.open(t, p.standby.DSN("failover-audit")))
			retries := connectionRetries(rec)
			t.Logf("synchronous failover (%s): acked %d, applied %d, exactly once %d, lost %d, doubled %d; %d connection retries, %d deliveries redelivered",
				drv, a.acked, a.applied, a.exact, a.lost, a.doubled, retries, load.errs.Load())
			if a.acked != failoverKeys || a.exact != failoverKeys || a.lost != 0 || a.doubled != 0 {
				t.Errorf("audit: acked %d, exactly once %d, lost %d, doubled %d; want all %d exactly once", a.acked, a.exact, a.lost, a.doubled, failoverKeys)
			}
			// A COMMIT that landed but whose answer died with the primary
			// is retried and reports Duplicate: Applied may be returned
			// fewer times than there are messages, never more.
			if a.applied > failoverKeys {
				t.Errorf("Applied returned %d times for %d messages", a.applied, failoverKeys)
			}
			if retries == 0 {
				t.Errorf("no transaction was retried after the primary died (last error: %v)", load.lastError.Load())
			}
		})
	}
}

// TestFailoverAsynchronousReplicationLosesAcks documents the hazard: with
// asynchronous replication a commit returns before the standby has it, the
// consumer acks, the broker forgets the message, and when the primary dies
// the promoted standby has neither the claim nor the effect. The test makes
// the loss certain: it cuts the replication link, lets messages be applied
// and acked on the primary alone, then kills it. Every such message is
// lost; nothing is doubled.
func TestFailoverAsynchronousReplicationLosesAcks(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			p := newReplicationPair(t)

			rep, err := postgres.CheckReplication(context.Background(), p.open(t, p.primary.DSN("failover-check")))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Synchronous() || len(rep.Warnings()) == 0 || !errors.Is(rep.Err(), postgres.ErrAcksOutrunReplication) {
				t.Fatalf("CheckReplication on an asynchronous primary warns of nothing: %+v", rep)
			}
			checkReplicationPrivileges(t, p)

			rec := &recorder{}
			mw := failoverConsumer(t, p, drv, rec)
			load := newFailoverLoad(failoverKeys, failoverCopies)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			const certain = 20 // messages acked on the primary alone before it dies
			reached := make(chan struct{})
			var cutOnce, killOnce sync.Once
			load.onAck = func(acks, lateLost int64) {
				if acks >= failoverKillAt {
					cutOnce.Do(func() {
						p.link.Cut()
						load.linkCut.Store(true)
					})
				}
				if lateLost >= certain {
					killOnce.Do(func() { close(reached) })
				}
			}
			orchestrated := p.orchestrate(t, ctx, cancel, load, reached)
			load.run(ctx, failoverWorkers, mw)
			<-orchestrated
			if ctx.Err() != nil {
				t.Fatalf("the load did not finish: %v (last error: %v)", ctx.Err(), load.lastError.Load())
			}

			a := load.audit(t, p.open(t, p.standby.DSN("failover-audit")))
			t.Logf("asynchronous failover (%s): acked %d, applied %d, exactly once %d, lost %d (of which %d applied after the link was cut), doubled %d; %d connection retries",
				drv, a.acked, a.applied, a.exact, a.lost, a.certainLoss, a.doubled, connectionRetries(rec))
			if a.certainLoss < certain {
				t.Fatalf("only %d messages were applied and acked on the primary alone, want %d", a.certainLoss, certain)
			}
			if a.certainLossFound != a.certainLoss {
				t.Errorf("%d of the %d messages applied after the replication link was cut survived the failover", a.certainLoss-a.certainLossFound, a.certainLoss)
			}
			if a.lost < a.certainLoss {
				t.Errorf("lost %d acked messages, want at least %d", a.lost, a.certainLoss)
			}
			if a.doubled != 0 {
				t.Errorf("%d messages have their effect more than once", a.doubled)
			}
			if a.acked != failoverKeys || a.exact+a.lost != failoverKeys {
				t.Errorf("audit: acked %d, exactly once %d, lost %d of %d", a.acked, a.exact, a.lost, failoverKeys)
			}
		})
	}
}
