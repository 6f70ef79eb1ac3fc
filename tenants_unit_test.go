package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
)

// tenantDBs opens one sqlmock database per tenant, counting the opens, and
// fails the tenants named in refuse.
type tenantDBs struct {
	mu     sync.Mutex
	opens  map[string]int
	dbs    map[string]*sql.DB
	refuse map[string]bool
}

func newTenantDBs(t *testing.T, refuse ...string) *tenantDBs {
	f := &tenantDBs{opens: map[string]int{}, dbs: map[string]*sql.DB{}, refuse: map[string]bool{}}
	for _, r := range refuse {
		f.refuse[r] = true
	}
	t.Cleanup(func() {
		for _, db := range f.dbs {
			_ = db.Close()
		}
	})
	return f
}

func (f *tenantDBs) open(_ context.Context, tenant string) (*sql.DB, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opens[tenant]++
	if f.refuse[tenant] {
		return nil, errors.New("no such database")
	}
	db, m, err := sqlmock.New()
	if err != nil {
		return nil, err
	}
	m.ExpectClose()
	f.dbs[tenant] = db
	return db, nil
}

func TestNewTenantsRefusesBadInput(t *testing.T) {
	f := newTenantDBs(t)
	for _, c := range []struct {
		name string
		cfg  idempotent.TenantsConfig
		opts []idempotent.Option
		want string
	}{
		{"no Open", idempotent.TenantsConfig{}, nil, "Open is nil"},
		{"negative MaxConns", idempotent.TenantsConfig{Open: f.open, MaxConns: -1}, nil, "MaxConns is -1"},
		{"bad option", idempotent.TenantsConfig{Open: f.open}, []idempotent.Option{idempotent.WithRetry(idempotent.RetryPolicy{})}, "MaxAttempts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, err := idempotent.NewTenants(pg, consumer, c.cfg, c.opts...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewTenants = %v, %v; want an error saying %q", ts, err, c.want)
			}
		})
	}
	if _, err := idempotent.NewTenants(pg, "bad consumer!", idempotent.TenantsConfig{Open: f.open}); !errors.Is(err, idempotent.ErrInvalidConsumer) {
		t.Fatalf("bad consumer: %v", err)
	}
	if len(f.opens) != 0 {
		t.Fatalf("opened %v before any tenant was used", f.opens)
	}
}

// TestTenantsMiddleware checks that each tenant's Middleware is made once,
// lazily, with its connections bounded, that a failed open is tried again,
// and that Close closes every database and refuses later calls.
func TestTenantsMiddleware(t *testing.T) {
	f := newTenantDBs(t, "down")
	ts, err := idempotent.NewTenants(pg, consumer, idempotent.TenantsConfig{Open: f.open, MaxConns: 3}, idempotent.WithTable("claims"))
	if err != nil {
		t.Fatal(err)
	}
	if c := ts.Config(); c.Consumer != consumer || c.Table != "claims" {
		t.Fatalf("Config %+v", c)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var got [16]*idempotent.Middleware
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mw, err := ts.Middleware(ctx, "acme")
			if err != nil {
				t.Error(err)
			}
			got[i] = mw
		}()
	}
	wg.Wait()
	for _, mw := range got {
		if mw == nil || mw != got[0] {
			t.Fatal("concurrent first uses got different Middlewares")
		}
	}
	other, err := ts.Middleware(ctx, "globex")
	if err != nil || other == got[0] {
		t.Fatalf("a second tenant: %v, same Middleware %v", err, other == got[0])
	}
	if f.opens["acme"] != 1 || f.opens["globex"] != 1 {
		t.Fatalf("opens %v, want one per tenant", f.opens)
	}
	if n := f.dbs["acme"].Stats().MaxOpenConnections; n != 3 {
		t.Fatalf("tenant database bounded to %d connections, want 3", n)
	}
	for range 2 {
		_, err := ts.Middleware(ctx, "down")
		var te *idempotent.TenantError
		if !errors.As(err, &te) || te.Tenant != "down" || !strings.Contains(err.Error(), "no such database") {
			t.Fatalf("a tenant whose database cannot be opened: %v", err)
		}
	}
	if f.opens["down"] != 2 {
		t.Fatalf("a failed open was kept: %d opens, want 2", f.opens["down"])
	}
	if _, err := ts.Middleware(ctx, ""); err == nil {
		t.Fatal("an empty tenant name was accepted")
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"acme", "globex"} {
		if err := f.dbs[name].Ping(); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("tenant %s's database not closed: Ping = %v", name, err)
		}
	}
	if _, err := ts.Middleware(ctx, "acme"); !errors.Is(err, idempotent.ErrTenantsClosed) {
		t.Fatalf("Middleware after Close: %v", err)
	}
}

// TestTenantsEach checks that Each runs over every listed tenant, in
// order, and that a tenant that cannot be opened or whose work fails does
// not stop the others.
func TestTenantsEach(t *testing.T) {
	f := newTenantDBs(t, "down")
	ts, err := idempotent.NewTenants(pg, consumer, idempotent.TenantsConfig{
		Open: f.open,
		List: func(context.Context) ([]string, error) { return []string{"c", "down", "a", "b", "a"}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Close() })
	var seen []string
	var calls atomic.Int32
	err = ts.Each(context.Background(), func(_ context.Context, tenant string, mw *idempotent.Middleware) error {
		calls.Add(1)
		seen = append(seen, tenant)
		if mw == nil {
			t.Errorf("tenant %s: nil Middleware", tenant)
		}
		if tenant == "b" {
			return errors.New("cleanup failed")
		}
		return nil
	})
	if got := strings.Join(seen, ","); got != "a,b,c" {
		t.Fatalf("Each ran over %s, want a,b,c", got)
	}
	var te *idempotent.TenantError
	if err == nil || !errors.As(err, &te) || !strings.Contains(err.Error(), `tenant "b": cleanup failed`) || !strings.Contains(err.Error(), `tenant "down"`) {
		t.Fatalf("Each = %v, want both failures named by tenant", err)
	}
	if err := ts.Each(context.Background(), nil); err == nil {
		t.Fatal("Each accepted a nil function")
	}
}
