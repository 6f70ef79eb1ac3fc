package watermill_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
	idwm "github.com/txclaim/idempotent/watermill"
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

// perTenant counts, by the tenant metadata field, the messages the router
// acks and nacks; on a nack it waits the RequeueError's delay, as a router
// middleware of the user's would, before the Pub/Sub redelivers.
type perTenant struct {
	mu            sync.Mutex
	acked, nacked map[string]int
}

func (p *perTenant) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		tenant := msg.Metadata.Get("tenant")
		p.mu.Lock()
		if err != nil {
			p.nacked[tenant]++
		} else {
			p.acked[tenant]++
		}
		p.mu.Unlock()
		var re *idwm.RequeueError
		if errors.As(err, &re) {
			time.Sleep(re.Delay) // the rule's delay before the nack, not synchronisation
		}
		return out, err
	}
}

func (p *perTenant) get(tenant string) (acked, nacked int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked[tenant], p.nacked[tenant]
}

// TestWithTenantOverRabbitMQ runs one handler, NewHandler with WithTenant,
// over two RabbitMQ queues, one per tenant, each tenant's claims and
// effects in a database (a schema) of its own. Tenant b's database is down
// at first: its messages are nacked, never acked, nothing is written in
// it, while all of a's are acked; once it is back, b's apply. The audit is
// exact: each tenant's distinct keys once, in its own database only.
// WithTenant with WithSubscriberTx is refused.
func TestWithTenantOverRabbitMQ(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	admin := testenv.OpenPostgres(t, 2)
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	ctx := context.Background()
	schemas, gates := map[string]string{}, map[string]*gate{}
	for _, tenant := range []string{"a", "b"} {
		s := testenv.UniqueName("wmt")
		schemas[tenant] = s
		if _, err := admin.Exec(`CREATE SCHEMA ` + s + `; CREATE TABLE ` + s + `.credits (k text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := admin.Exec(`DROP SCHEMA ` + s + ` CASCADE`); err != nil {
				t.Errorf("drop schema %s: %v", s, err)
			}
		})
		mw, err := idempotent.New(admin, postgres.New(), "credits", idempotent.WithTable(s+".processed_messages"))
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		base, err := pq.NewConnector(dsn + sep + "search_path=" + s)
		if err != nil {
			t.Fatal(err)
		}
		gates[tenant] = &gate{base: base}
	}
	gates["b"].down.Store(true)
	ts, err := idempotent.NewTenants(postgres.New(), "credits", idempotent.TenantsConfig{
		Open:     func(_ context.Context, tenant string) (*sql.DB, error) { return sql.OpenDB(gates[tenant]), nil },
		MaxConns: 2,
	}, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Close() })

	tenantOf := func(msg *message.Message) (string, error) {
		if tenant := msg.Metadata.Get("tenant"); tenant != "" {
			return tenant, nil
		}
		return "", errors.New("no tenant metadata")
	}
	h := func(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO credits VALUES ($1)`, msg.UUID)
		return err
	}
	if _, err := idwm.NewHandler(nil, h, idwm.WithTenant(ts, tenantOf), idwm.WithSubscriberTx(func(context.Context) (*sql.Tx, bool) { return nil, false })); err == nil {
		t.Fatal("WithTenant accepted with WithSubscriberTx")
	}
	handler, err := idwm.NewHandler(nil, h, idwm.WithTenant(ts, tenantOf), idwm.WithoutEventTime(), idwm.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}

	counts := &perTenant{acked: map[string]int{}, nacked: map[string]int{}}
	r := newRouter(t)
	r.AddMiddleware(counts.middleware)
	queues := map[string]string{}
	for _, tenant := range []string{"a", "b"} {
		queues[tenant] = amqpQueue(t, url)
		sub, _ := amqpSubscriber(t, url)
		r.AddConsumerHandler("credits-"+tenant, queues[tenant], sub, handler)
	}
	runRouter(t, r)

	const distinct, dups = 150, 50
	pub := amqpPublisher(t, url)
	for _, tenant := range []string{"a", "b"} {
		var msgs []*message.Message
		for i := range distinct + dups {
			m := message.NewMessage(fmt.Sprintf("%s-%d", tenant, i%distinct), []byte("{}"))
			m.Metadata.Set("tenant", tenant)
			msgs = append(msgs, m)
		}
		if err := pub.Publish(queues[tenant], msgs...); err != nil {
			t.Fatal(err)
		}
	}
	const total = distinct + dups
	waitFor(t, time.Minute, "tenant a's messages acked, b's nacked", func() (bool, error) {
		a, _ := counts.get("a")
		_, bn := counts.get("b")
		return a == total && bn > 0, nil
	})
	if ba, _ := counts.get("b"); ba != 0 {
		t.Fatalf("%d messages of tenant b acked while its database was down", ba)
	}
	if n := testenv.Count(t, admin, schemas["b"], `SELECT count(*) FROM $S.processed_messages`); n != 0 {
		t.Fatalf("tenant b holds %d claims while its database was down", n)
	}
	gates["b"].down.Store(false)
	waitFor(t, time.Minute, "tenant b's messages acked once its database is back", func() (bool, error) {
		b, _ := counts.get("b")
		return b == total, nil
	})
	for tenant, s := range schemas {
		for _, q := range []string{`SELECT count(*) FROM $S.credits`, `SELECT count(DISTINCT k) FROM $S.credits`, `SELECT count(*) FROM $S.processed_messages`} {
			if n := testenv.Count(t, admin, s, q); n != distinct {
				t.Errorf("tenant %s: %s = %d, want %d", tenant, q, n, distinct)
			}
		}
	}
	_, bn := counts.get("b")
	t.Logf("tenant b: %d nacks while its database was down", bn)
}
