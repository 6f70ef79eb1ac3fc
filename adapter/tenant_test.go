package adapter_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// tenantMsg is a delivery with its tenant before the colon: "acme:a".
type tenantMsg string

func (m tenantMsg) parts() (string, string) {
	tenant, key, _ := strings.Cut(string(m), ":")
	return tenant, key
}

func tenantConfig(t *testing.T, ts *idempotent.Tenants) adapter.Config[tenantMsg] {
	t.Helper()
	cfg := adapter.NewConfig(adapter.Transport[tenantMsg]{
		Name:       "test",
		DefaultKey: func(m tenantMsg) (string, error) { _, k := m.parts(); return k, nil },
	})
	if err := cfg.SetNoEventTime(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.SetTenant(ts, func(m tenantMsg) (string, error) {
		tenant, _ := m.parts()
		if tenant == "bad" {
			return "", errors.New("no tenant header")
		}
		return tenant, nil
	}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestTenantCheck(t *testing.T) {
	ts, err := idempotent.NewTenants(postgres.New(), "loyalty", idempotent.TenantsConfig{
		Open: func(context.Context, string) (*sql.DB, error) { return nil, errors.New("unused") },
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := tenantConfig(t, ts)
	if err := cfg.SetTenant(ts, func(tenantMsg) (string, error) { return "", nil }); err == nil {
		t.Fatal("SetTenant given twice was accepted")
	}
	db, _ := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check(mw); err == nil || !strings.Contains(err.Error(), "both a Middleware and WithTenant") {
		t.Fatalf("Check with a Middleware and tenants = %v", err)
	}
	if err := cfg.Check(nil); err != nil {
		t.Fatalf("Check(nil) with tenants = %v", err)
	}
	plain := adapter.NewConfig(adapter.Transport[tenantMsg]{Name: "test", DefaultKey: func(m tenantMsg) (string, error) { return string(m), nil }})
	if err := plain.SetTenant(nil, nil); err == nil {
		t.Fatal("SetTenant(nil, nil) was accepted")
	}
	if err := plain.Check(nil); err == nil || !strings.Contains(err.Error(), "nil Middleware") {
		t.Fatalf("Check(nil) without tenants = %v", err)
	}
	for _, m := range []tenantMsg{"bad:a", ":a"} {
		_, err := cfg.Tenant(m)
		if !adapter.IsPoison(err) {
			t.Fatalf("tenant of %q: %v, want poison", m, err)
		}
		if d := cfg.Rule().Settle(idempotent.Message{Key: "a"}, err, 1); d.Action != adapter.DeadLetter {
			t.Fatalf("a delivery without a tenant is settled %v, want DeadLetter", d.Action)
		}
	}
}

// TestTenantBatchIsSplit: a batch mixing three tenants is claimed in one
// transaction per tenant, on that tenant's database; the tenant whose
// database fails gets its deliveries' error (requeued), the others are
// applied, and the delivery without a tenant is poison.
func TestTenantBatchIsSplit(t *testing.T) {
	var mu sync.Mutex
	mocked := map[string]sqlmock.Sqlmock{}
	dbs := map[string]*sql.DB{}
	for _, name := range []string{"acme", "globex", "down"} {
		db, mock, err := mocks.Open()
		if err != nil {
			t.Fatal(err)
		}
		mocked[name], dbs[name] = mock, db
	}
	ts, err := idempotent.NewTenants(postgres.New(), "loyalty", idempotent.TenantsConfig{
		Open: func(_ context.Context, name string) (*sql.DB, error) {
			mu.Lock()
			defer mu.Unlock()
			return dbs[name], nil
		},
	}, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	mwOf := func(name string) *idempotent.Middleware {
		mw, err := ts.Middleware(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	for _, name := range []string{"acme", "globex"} {
		m := mocks.ForMiddleware(mocked[name], mwOf(name))
		if name == "acme" {
			m.ExpectBatchApplied([]string{"a", "c"}, "a", "c")
		} else {
			m.ExpectBatchApplied([]string{"b"}, "b")
		}
		m.ExpectCommit()
	}
	mwOf("down")
	errDown := errors.New("connection refused")
	mocked["down"].ExpectBegin().WillReturnError(errDown)
	cfg := tenantConfig(t, ts)
	if err := cfg.Check(nil); err != nil {
		t.Fatal(err)
	}
	ds := []tenantMsg{"acme:a", "globex:b", "down:d", "bad:x", "acme:c"}
	msgs := make([]idempotent.Message, len(ds))
	for i, d := range ds {
		msgs[i], _ = cfg.Message(d)
	}
	var hmu sync.Mutex
	given := map[string]int{}
	res := cfg.ProcessBatch(context.Background(), nil, ds, msgs, nil, func(_ context.Context, _ *sql.Tx, fresh []tenantMsg) error {
		hmu.Lock()
		defer hmu.Unlock()
		for _, m := range fresh {
			tenant, _ := m.parts()
			given[tenant]++
		}
		return nil
	})
	if given["acme"] != 2 || given["globex"] != 1 || given["down"] != 0 {
		t.Fatalf("handler given %v", given)
	}
	for i, want := range []string{"applied", "applied", "down", "poison", "applied"} {
		r := res[i]
		var ok bool
		switch want {
		case "applied":
			ok = r.Err == nil && r.Outcome == idempotent.Applied
		case "down":
			ok = errors.Is(r.Err, errDown) && cfg.Rule().Settle(msgs[i], r.Err, 1).Action == adapter.Requeue
		case "poison":
			ok = adapter.IsPoison(r.Err)
		}
		if !ok {
			t.Errorf("%s: %+v, want %s", ds[i], r, want)
		}
	}
	for name, mock := range mocked {
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Errorf("tenant %s: %v", name, err)
		}
	}
	_ = ts.Close() // the mocks' spare connections answer Close with an error
}
