package kafka_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// gate is a tenant's database whose server can be made unreachable: while
// down, every new connection is refused (the test also ends the open ones).
type gate struct {
	base driver.Connector
	down atomic.Bool
}

func (g *gate) Connect(ctx context.Context) (driver.Conn, error) {
	if g.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return g.base.Connect(ctx)
}

func (g *gate) Driver() driver.Driver { return g.base.Driver() }

// TestWithTenantPartitionsPerTenant consumes one topic of four partitions
// for two tenants, partitions 0 and 1 of tenant a, 2 and 3 of tenant b,
// each tenant's claims, offsets and effects in a schema of its own reached
// through a database of its own. Tenant b's database is down from the
// start, so its partitions are assigned without a stored offset read: a's
// records all apply and b's are requeued, never committed; b comes back
// and its records apply. Then b's database goes down mid-run, its open
// connections ended, while a second round of records arrives: a's apply,
// b's wait; b comes back and applies from its stored offsets. The audit is
// exact for both modes: each tenant's distinct keys once, no effect in the
// other tenant's database, the offsets at each partition's end in its
// tenant's database only.
func TestWithTenantPartitionsPerTenant(t *testing.T) {
	for _, mode := range []string{"record", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testTenantPartitions(t, mode == "batch")
		})
	}
}

func testTenantPartitions(t *testing.T, batch bool) {
	admin := openDB(t, 2)
	ctx := context.Background()
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	schemas := map[string]string{"a": schema(t, admin), "b": schema(t, admin)}
	gates := map[string]*gate{}
	for name, s := range schemas {
		sep := "?"
		if containsQuery(dsn) {
			sep = "&"
		}
		base, err := pq.NewConnector(dsn + sep + "search_path=" + s + "&application_name=" + s)
		if err != nil {
			t.Fatal(err)
		}
		gates[name] = &gate{base: base}
	}
	gates["b"].down.Store(true)
	ts, err := idempotent.NewTenants(postgres.New(), "pay", idempotent.TenantsConfig{
		Open:         func(_ context.Context, tenant string) (*sql.DB, error) { return sql.OpenDB(gates[tenant]), nil },
		MaxConns:     3,
		EnsureSchema: false,
	}, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Close() })
	for name, s := range schemas {
		mw, err := idempotent.New(admin, postgres.New(), "pay", idempotent.WithTable(s+".processed_messages"))
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatalf("tenant %s: %v", name, err)
		}
	}
	tenantOf := func(_ string, p int32) (string, error) {
		switch p {
		case 0, 1:
			return "a", nil
		case 2, 3:
			return "b", nil
		}
		return "", fmt.Errorf("partition %d has no tenant", p)
	}

	// Refused at construction: a Middleware as well as WithTenant, and
	// WithTenant with a coalescing Middleware.
	noop := func(context.Context, *sql.Tx, *kgo.Record) error { return nil }
	if _, err := kafka.NewConsumer(newMiddleware(t, admin, schemas["a"], "pay"), noop, kafka.WithTenant(ts, tenantOf)); err == nil {
		t.Fatal("NewConsumer accepted a Middleware as well as WithTenant")
	}
	co, err := idempotent.NewTenants(postgres.New(), "pay", idempotent.TenantsConfig{
		Open: func(context.Context, string) (*sql.DB, error) { return nil, errors.New("unused") },
	}, idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kafka.NewConsumer(nil, noop, kafka.WithTenant(co, tenantOf)); err == nil {
		t.Fatal("WithTenant accepted with a coalescing Middleware: a coalesced transaction would span tenants")
	}

	events := &counter{}
	var c *kafka.Consumer
	if batch {
		c, err = kafka.NewBatchConsumer(nil, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			ids := make([]string, len(rs))
			for i, r := range rs {
				p, err := kafka.JSON[payment](r.Value)
				if err != nil {
					return err
				}
				ids[i] = p.ID
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, account, amount, member) SELECT id, 'acct', 1, 'm' FROM unnest($1::text[]) AS u(id)`, pq.Array(ids))
			return err
		}, kafka.WithTenant(ts, tenantOf), kafka.WithObserver(events), kafka.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	} else {
		c, err = kafka.NewConsumer(nil, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, account, amount, member) VALUES ($1, $2, $3, 'm')`, p.ID, p.Account, p.Amount)
			return err
		}), kafka.WithTenant(ts, tenantOf), kafka.WithObserver(events), kafka.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	}
	if err != nil {
		t.Fatal(err)
	}

	const topic = "tenants"
	cluster := newCluster(t, 4, topic)
	prod := producer(t, cluster)
	sent := map[int32]int64{} // records per partition
	send := func(round, perPartition int) {
		for p := range int32(4) {
			for i := range perPartition {
				id := fmt.Sprintf("r%d-p%d-%d", round, p, i%(perPartition*3/4)) // a quarter are producer duplicates
				v := fmt.Appendf(nil, `{"id":%q,"account":"acct","amount":1}`, id)
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: v,
					Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}}).FirstErr(); err != nil {
					t.Fatal(err)
				}
				sent[p]++
			}
		}
	}
	offsets := func(tenant string) map[int32]int64 { return storedOffsets(t, admin, schemas[tenant], "pay", topic) }
	done := func(tenant string, parts ...int32) func() (bool, error) {
		return func() (bool, error) {
			got := offsets(tenant)
			for _, p := range parts {
				if got[p] != sent[p] {
					return false, nil
				}
			}
			return true, nil
		}
	}
	send(1, 40)
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("tenants-group"), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(50*time.Millisecond))
	defer m.stop(t)
	waitFor(t, "tenant a's partitions applied while b's database is down", done("a", 0, 1))
	waitFor(t, "tenant b's records requeued", func() (bool, error) { return events.get(adapter.EventRequeued) > 0, nil })
	if got := offsets("b"); len(got) != 0 {
		t.Fatalf("tenant b's offsets %v stored while its database was down", got)
	}
	if n := testenv.Count(t, admin, schemas["b"], `SELECT count(*) FROM $S.processed_messages`); n != 0 {
		t.Fatalf("tenant b holds %d claims while its database was down", n)
	}
	gates["b"].down.Store(false)
	waitFor(t, "tenant b's partitions applied once its database is back", done("b", 2, 3))

	// b goes down mid-run: its open connections end, new ones are refused.
	gates["b"].down.Store(true)
	if _, err := admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, schemas["b"]); err != nil {
		t.Fatal(err)
	}
	requeued := events.get(adapter.EventRequeued)
	bBefore := offsets("b")
	send(2, 40)
	waitFor(t, "tenant a's second round applied while b's database is down", done("a", 0, 1))
	waitFor(t, "tenant b's second round requeued", func() (bool, error) { return events.get(adapter.EventRequeued) > requeued, nil })
	if got := offsets("b"); got[2] != bBefore[2] || got[3] != bBefore[3] {
		t.Fatalf("tenant b's offsets moved from %v to %v while its database was down", bBefore, got)
	}
	gates["b"].down.Store(false)
	waitFor(t, "tenant b's second round applied", done("b", 2, 3))

	for tenant, parts := range map[string][]int32{"a": {0, 1}, "b": {2, 3}} {
		s := schemas[tenant]
		// 30 distinct ids per partition and round.
		want := int64(len(parts) * 2 * 30)
		if n := testenv.Count(t, admin, s, `SELECT count(*) FROM $S.ledger`); n != want {
			t.Errorf("tenant %s: %d ledger rows, want %d (each distinct id once)", tenant, n, want)
		}
		if n := testenv.Count(t, admin, s, `SELECT count(DISTINCT id) FROM $S.ledger`); n != want {
			t.Errorf("tenant %s: %d distinct ids, want %d", tenant, n, want)
		}
		if n := testenv.Count(t, admin, s, `SELECT count(*) FROM $S.processed_messages`); n != want {
			t.Errorf("tenant %s: %d claims, want %d", tenant, n, want)
		}
		got := offsets(tenant)
		if len(got) != len(parts) {
			t.Errorf("tenant %s: offsets of partitions %v, want only its own %v", tenant, got, parts)
		}
	}
	t.Logf("requeued %d times in all while tenant b's database was down", events.get(adapter.EventRequeued))
}

func containsQuery(dsn string) bool {
	for _, r := range dsn {
		if r == '?' {
			return true
		}
	}
	return false
}
