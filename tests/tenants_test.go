package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// tenantDelivery is one delivery of the tenants test's in-process queue.
type tenantDelivery struct {
	tenant, key string
	attempt     int
}

// tenantQueue is an in-process broker queue: deliveries taken in batches,
// acked or requeued after a delay, with the counts the test waits on.
type tenantQueue struct {
	ch chan *tenantDelivery

	mu     sync.Mutex
	cond   *sync.Cond
	acked  map[string]int // tenant → acked deliveries
	failed map[string]int // tenant → requeued deliveries
	total  int
	errs   []error
}

func newTenantQueue(capacity int) *tenantQueue {
	q := &tenantQueue{ch: make(chan *tenantDelivery, capacity), acked: map[string]int{}, failed: map[string]int{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// take returns up to n deliveries, waiting for the first.
func (q *tenantQueue) take(ctx context.Context, n int) []*tenantDelivery {
	var ds []*tenantDelivery
	select {
	case d := <-q.ch:
		ds = append(ds, d)
	case <-ctx.Done():
		return nil
	}
	for len(ds) < n {
		select {
		case d := <-q.ch:
			ds = append(ds, d)
		default:
			return ds
		}
	}
	return ds
}

// wait blocks until cond holds (called with q.mu held), failing after a
// generous bound: it is woken by every settlement, not by time.
func (q *tenantQueue) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	stop := time.AfterFunc(3*time.Minute, func() {
		q.mu.Lock()
		q.errs = append(q.errs, fmt.Errorf("timed out waiting until %s", what))
		q.mu.Unlock()
		q.cond.Broadcast()
	})
	defer stop.Stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	for !cond() && len(q.errs) == 0 {
		q.cond.Wait()
	}
	if len(q.errs) > 0 {
		t.Fatalf("waiting until %s: %v (acked %v, requeued %v)", what, errors.Join(q.errs...), q.acked, q.failed)
	}
}

// TestTenantsDatabasePerTenant runs 3,000 deliveries, duplicates among
// them, for 5 tenants, each with a database of its own — 4 on the shared
// server, 1 on a server of the test's own — through the adapter layer's
// tenant routing (adapter.Config.SetTenant) in batches that mix tenants.
// Midway the fifth tenant's server stops: its deliveries are requeued,
// never acked, while the other tenants' all complete; once it is back they
// apply, once. Every tenant's effects and claims are then audited exactly,
// and one cleanup over all tenants (Tenants.Each) deletes exactly the
// claims past retention.
func TestTenantsDatabasePerTenant(t *testing.T) {
	bin := failoverBin(t)
	heavy(t)
	ctx := context.Background()
	mon := openMonitor(t)

	const tenants, distinct, deliveries = 5, 2400, 3000
	names := make([]string, tenants)
	dsns := map[string]string{}
	for i := range tenants - 1 {
		names[i] = uniqueName("tenant")
		if _, err := mon.Exec("CREATE DATABASE " + pq.QuoteIdentifier(names[i])); err != nil {
			t.Fatal(err)
		}
		name := names[i]
		t.Cleanup(func() {
			if _, err := mon.Exec("DROP DATABASE " + pq.QuoteIdentifier(name) + " WITH (FORCE)"); err != nil {
				t.Errorf("drop database %s: %v", name, err)
			}
		})
		u, err := url.Parse(pgDSN)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + name
		dsns[name] = u.String()
	}
	own, err := pgcluster.New(ctx, bin, pgcluster.Options{Parent: t.TempDir(), Prefix: "tenant-", TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Remove)
	if err := own.Start(ctx); err != nil {
		t.Fatal(err)
	}
	down := uniqueName("tenant")
	names[tenants-1] = down
	dsns[down] = own.DSN("tenant")

	// Each tenant's effect table, without a unique key: a doubled effect
	// shows as a second row.
	tenantDB := map[string]*sql.DB{}
	for _, name := range names {
		db, err := sql.Open("postgres", dsns[name])
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		tenantDB[name] = db
		if _, err := db.Exec("CREATE TABLE credits (k text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, db := range tenantDB {
			_ = db.Close()
		}
	})

	ts, err := idempotent.NewTenants(postgres.New(), "billing", idempotent.TenantsConfig{
		Open:         func(_ context.Context, tenant string) (*sql.DB, error) { return sql.Open("postgres", dsns[tenant]) },
		List:         func(context.Context) ([]string, error) { return names, nil },
		MaxConns:     2,
		EnsureSchema: true,
	}, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ts.Close(); err != nil {
			t.Error(err)
		}
	})

	cfg := adapter.NewConfig(adapter.Transport[*tenantDelivery]{
		Name:       "tenants-test",
		DefaultKey: func(d *tenantDelivery) (string, error) { return d.key, nil },
	})
	for _, err := range []error{
		cfg.SetNoEventTime(),
		cfg.SetRetryDelay(time.Millisecond, 20*time.Millisecond),
		cfg.SetTenant(ts, func(d *tenantDelivery) (string, error) { return d.tenant, nil }),
		cfg.Check(nil),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	rule := cfg.Rule()

	// 2,400 distinct keys over the tenants, 600 of them delivered twice.
	var all []*tenantDelivery
	want := map[string]int{} // tenant → distinct keys
	for i := range distinct {
		d := &tenantDelivery{tenant: names[i%tenants], key: fmt.Sprintf("order-%d", i)}
		want[d.tenant]++
		all = append(all, d)
		if i < deliveries-distinct {
			all = append(all, &tenantDelivery{tenant: d.tenant, key: d.key})
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	perTenant := map[string]int{}
	for _, d := range all {
		perTenant[d.tenant]++
	}

	q := newTenantQueue(len(all))
	runCtx, stop := context.WithCancel(ctx)
	var workers sync.WaitGroup
	for range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				ds := q.take(runCtx, 25)
				if ds == nil {
					return
				}
				msgs := make([]idempotent.Message, len(ds))
				errs := make([]error, len(ds))
				for i, d := range ds {
					msgs[i], errs[i] = cfg.Message(d)
				}
				res := cfg.ProcessBatch(runCtx, nil, ds, msgs, errs, func(ctx context.Context, tx *sql.Tx, fresh []*tenantDelivery) error {
					for _, d := range fresh {
						if _, err := tx.ExecContext(ctx, "INSERT INTO credits VALUES ($1)", d.key); err != nil {
							return err
						}
					}
					return nil
				})
				q.mu.Lock()
				for i, d := range ds {
					d.attempt++
					switch dec := rule.Settle(msgs[i], res[i].Err, d.attempt); dec.Action {
					case adapter.Ack:
						q.acked[d.tenant]++
						q.total++
					case adapter.Requeue:
						q.failed[d.tenant]++
						time.AfterFunc(dec.Delay, func() { q.ch <- d })
					default:
						q.errs = append(q.errs, fmt.Errorf("delivery %s of %s dead-lettered: %w", d.key, d.tenant, dec.Err))
					}
				}
				q.mu.Unlock()
				q.cond.Broadcast()
			}
		}()
	}
	t.Cleanup(func() { stop(); workers.Wait() })

	half := len(all) / 2
	for _, d := range all[:half] {
		q.ch <- d
	}
	q.wait(t, "the first half is acked", func() bool { return q.total == half })
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	ackedBefore, failedBefore := q.acked[down], q.failed[down]
	q.mu.Unlock()
	for _, d := range all[half:] {
		q.ch <- d
	}
	// The others finish with the fifth tenant's server down; its
	// deliveries are requeued meanwhile and none is acked.
	q.wait(t, "every other tenant is done and the stopped one was requeued", func() bool {
		for _, name := range names[:tenants-1] {
			if q.acked[name] != perTenant[name] {
				return false
			}
		}
		return q.failed[down] > failedBefore
	})
	q.mu.Lock()
	ackedDown := q.acked[down] - ackedBefore
	requeued := q.failed[down] - failedBefore
	q.mu.Unlock()
	if ackedDown != 0 {
		t.Fatalf("%d deliveries of the stopped tenant acked while its server was down", ackedDown)
	}
	if err := own.Start(ctx); err != nil {
		t.Fatal(err)
	}
	q.wait(t, "every delivery is acked", func() bool { return q.total == len(all) })
	stop()
	workers.Wait()
	t.Logf("stopped tenant: %d deliveries requeued while down, %d acked after the restart", requeued, perTenant[down]-ackedBefore)
	for name, n := range q.failed {
		if name != down && n != 0 {
			t.Errorf("tenant %s: %d deliveries requeued, want 0 (only the stopped tenant's fail)", name, n)
		}
	}

	// Exact audit, then one cleanup over every tenant: the claims of keys
	// ending in 7 are made 60 days old, past the 30-day retention.
	old := map[string]int64{}
	for _, name := range names {
		db := tenantDB[name]
		var rows, keys, claims int
		if err := db.QueryRow("SELECT count(*), count(DISTINCT k) FROM credits").Scan(&rows, &keys); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow("SELECT count(*) FROM processed_messages WHERE consumer = 'billing'").Scan(&claims); err != nil {
			t.Fatal(err)
		}
		if rows != want[name] || keys != want[name] || claims != want[name] {
			t.Errorf("tenant %s: %d effects of %d keys, %d claims; want %d of each", name, rows, keys, claims, want[name])
		}
		r, err := db.Exec("UPDATE processed_messages SET processed_at = now() - interval '60 days' WHERE message_key LIKE '%7'")
		if err != nil {
			t.Fatal(err)
		}
		if old[name], err = r.RowsAffected(); err != nil {
			t.Fatal(err)
		}
	}
	deleted := map[string]int64{}
	if err := ts.Each(ctx, func(ctx context.Context, tenant string, mw *idempotent.Middleware) error {
		n, err := mw.ClaimTable().Cleanup(ctx, idempotent.DefaultCleanupOptions())
		deleted[tenant] = n
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		var left int64
		if err := tenantDB[name].QueryRow("SELECT count(*) FROM processed_messages").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if deleted[name] != old[name] || left != int64(want[name])-old[name] {
			t.Errorf("tenant %s: cleanup deleted %d claims and left %d, want %d deleted and %d left", name, deleted[name], left, old[name], int64(want[name])-old[name])
		}
	}
}
