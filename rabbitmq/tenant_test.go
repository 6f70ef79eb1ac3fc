package rabbitmq_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

// refusedDB is a database whose server refuses every connection.
type refusedDB struct{}

func (refusedDB) Connect(context.Context) (driver.Conn, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}
func (refusedDB) Driver() driver.Driver { return refusedDriver{} }

type refusedDriver struct{}

func (refusedDriver) Open(string) (driver.Conn, error) {
	return refusedDB{}.Connect(context.Background())
}

// TestWithTenantRoutesEachDelivery: deliveries of two tenants apply in
// their own tenant's database; a third tenant's database refuses
// connections, so its delivery is requeued, never acked; a delivery
// without a tenant header is rejected.
func TestWithTenantRoutesEachDelivery(t *testing.T) {
	t.Parallel()
	dbs := map[string]*claimDB{"acme": {claims: map[string]bool{}}, "globex": {claims: map[string]bool{}}}
	ts, err := idempotent.NewTenants(plainDialect{postgres.New()}, "loyalty", idempotent.TenantsConfig{
		Open: func(_ context.Context, tenant string) (*sql.DB, error) {
			if cdb, ok := dbs[tenant]; ok {
				return sql.OpenDB(cdb), nil
			}
			return sql.OpenDB(refusedDB{}), nil
		},
	}, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Close() })
	f := newFakeChannel()
	c := newConsumer(t, nil, effect, rabbitmq.WithRetryDelay(time.Millisecond, time.Millisecond),
		rabbitmq.WithTenant(ts, func(d *amqp.Delivery) (string, error) {
			tenant, _ := d.Headers["tenant"].(string)
			if tenant == "" {
				return "", errors.New("no tenant header")
			}
			return tenant, nil
		}))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "order-1", Headers: amqp.Table{"tenant": "acme"}})
	f.deliver(amqp.Delivery{MessageId: "order-2", Headers: amqp.Table{"tenant": "globex"}})
	f.deliver(amqp.Delivery{MessageId: "order-3", Headers: amqp.Table{"tenant": "down"}})
	f.deliver(amqp.Delivery{MessageId: "order-4"})
	for _, e := range []string{"ack 1", "ack 2", "nack 3 requeue", "reject 4"} {
		waitFor(t, e, hasEvent(f, e))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for tenant, key := range map[string]string{"acme": "order-1", "globex": "order-2"} {
		got := dbs[tenant].committed()
		if len(got) != 1 || !strings.HasSuffix(got[0], key) {
			t.Errorf("tenant %s committed %q, want its own delivery %s only", tenant, got, key)
		}
	}
	for _, e := range f.log() {
		if e == "ack 3" {
			t.Fatal("the delivery of the tenant whose database is down was acked")
		}
	}
	if _, err := rabbitmq.NewConsumer(nil, effect); err == nil {
		t.Fatal("NewConsumer without a Middleware or WithTenant was accepted")
	}
}
