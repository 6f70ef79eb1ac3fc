package idempotent

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/txclaim/idempotent/dialect"
)

// ErrTenantsClosed reports a call on a Tenants after Close.
var ErrTenantsClosed = errors.New("idempotent: tenants closed")

// DefaultTenantConns is TenantsConfig.MaxConns when it is 0.
const DefaultTenantConns = 4

// TenantsConfig says how a Tenants reaches each tenant's database.
type TenantsConfig struct {
	// Open returns the database of tenant: typically sql.Open with the
	// tenant's DSN, which sends nothing yet. It is called the first time a
	// tenant is used, and again after a failed first use (a failure is not
	// kept). The Tenants owns the *sql.DB from then on: it sets its
	// connection bound and closes it in Close. The name comes from a
	// delivery: Open must refuse a tenant it does not know (its error
	// fails that delivery, which is redelivered; mark it with
	// adapter.ErrPoison to dead-letter it instead). Required.
	Open func(ctx context.Context, tenant string) (*sql.DB, error)
	// List returns every tenant, for Each: the upkeep (cleanup,
	// partitions, stats) runs over all of them, not only those that
	// received a message since the process started. Nil means Each runs
	// over the tenants named so far (by Middleware or a delivery).
	List func(ctx context.Context) ([]string, error)
	// MaxConns bounds each tenant's open connections (sql.DB's
	// SetMaxOpenConns), so that many tenants cannot exhaust a server
	// between them. Default DefaultTenantConns.
	MaxConns int
	// EnsureSchema creates each tenant's claim table, if missing, the first
	// time the tenant is used (Middleware.EnsureSchema). Default false: the
	// tables come from a migration.
	EnsureSchema bool
}

// Tenants holds one Middleware per tenant database, for a consumer whose
// messages belong to tenants that each have a database of their own: each
// tenant's claims live beside its effects, in its own claim table, so the
// retention horizon and the pre-check scope are per tenant database by
// construction. A tenant's Middleware is created on first use (Middleware)
// with the dialect, consumer name and options given to NewTenants, on the
// database TenantsConfig.Open returns, with at most TenantsConfig.MaxConns
// connections. A tenant whose database is down fails only its own
// messages. It is safe for concurrent use. Close closes every database it
// opened.
//
// The adapter package routes each delivery of a broker adapter to its
// tenant's Middleware (adapter.Config.SetTenant, each adapter's
// WithTenant); a batch is split by tenant, each tenant's part in a
// transaction of its own.
type Tenants struct {
	cfg      TenantsConfig
	d        dialect.Dialect
	consumer string
	opts     []Option
	template *Middleware

	mu      sync.Mutex
	closed  bool
	tenants map[string]*tenantEntry
}

// tenantEntry is one tenant's Middleware, created once under its own lock
// so that a tenant whose database is slow to answer holds back only its
// own callers.
type tenantEntry struct {
	mu sync.Mutex
	db *sql.DB
	mw *Middleware
}

// NewTenants returns a Tenants whose Middlewares speak dialect d for
// consumer with opts, as New would create them. The options are checked
// now, against no database: a bad one is an error here, not at the first
// message. Nothing is opened until a tenant is used.
func NewTenants(d dialect.Dialect, consumer string, cfg TenantsConfig, opts ...Option) (*Tenants, error) {
	if cfg.Open == nil {
		return nil, errors.New("idempotent: NewTenants: TenantsConfig.Open is nil")
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("idempotent: NewTenants: TenantsConfig.MaxConns is %d, want 0 (the default, %d) or more", cfg.MaxConns, DefaultTenantConns)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultTenantConns
	}
	// A Middleware on a database that refuses every connection checks the
	// options and gives the Config every tenant's Middleware shares.
	template, err := New(sql.OpenDB(noDatabase{}), d, consumer, opts...)
	if err != nil {
		return nil, fmt.Errorf("idempotent: NewTenants: %w", err)
	}
	return &Tenants{cfg: cfg, d: d, consumer: consumer, opts: opts, template: template, tenants: map[string]*tenantEntry{}}, nil
}

// Config returns the configuration every tenant's Middleware has (the
// Consumer, Dialect, table and retention given to NewTenants).
func (t *Tenants) Config() Config { return t.template.Config() }

// Middleware returns tenant's Middleware, opening its database on first
// use (and creating its claim table if TenantsConfig.EnsureSchema is set).
// A failure to open is returned, wrapped in a *TenantError, and tried again
// at the next call. tenant must not be empty.
func (t *Tenants) Middleware(ctx context.Context, tenant string) (*Middleware, error) {
	if tenant == "" {
		return nil, errors.New("idempotent: Tenants: empty tenant name")
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, &TenantError{Tenant: tenant, Err: ErrTenantsClosed}
	}
	e := t.tenants[tenant]
	if e == nil {
		e = &tenantEntry{}
		t.tenants[tenant] = e
	}
	t.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mw != nil {
		return e.mw, nil
	}
	db, err := t.cfg.Open(ctx, tenant)
	if err == nil && db == nil {
		err = errors.New("TenantsConfig.Open returned a nil *sql.DB")
	}
	if err != nil {
		return nil, &TenantError{Tenant: tenant, Err: fmt.Errorf("open: %w", err)}
	}
	db.SetMaxOpenConns(t.cfg.MaxConns)
	db.SetMaxIdleConns(t.cfg.MaxConns)
	mw, err := New(db, t.d, t.consumer, t.opts...)
	if err == nil && t.cfg.EnsureSchema {
		err = mw.EnsureSchema(ctx)
	}
	if err != nil {
		_ = db.Close()
		return nil, &TenantError{Tenant: tenant, Err: err}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		// Close ran meanwhile and did not see this database.
		_ = db.Close()
		return nil, &TenantError{Tenant: tenant, Err: ErrTenantsClosed}
	}
	e.db, e.mw = db, mw
	return mw, nil
}

// Each runs fn with every tenant's Middleware, in the order of the names:
// every tenant TenantsConfig.List returns, or, without List, every tenant
// used so far. It is how the upkeep runs over all tenants:
//
//	err := ts.Each(ctx, func(ctx context.Context, tenant string, mw *idempotent.Middleware) error {
//		_, err := mw.ClaimTable().Cleanup(ctx, idempotent.CleanupOptions{})
//		return err
//	})
//
// A tenant whose database cannot be opened, or for which fn fails, does
// not stop the others: Each returns the failures joined, each a
// *TenantError naming its tenant.
func (t *Tenants) Each(ctx context.Context, fn func(ctx context.Context, tenant string, mw *Middleware) error) error {
	if fn == nil {
		return errors.New("idempotent: Tenants.Each: nil function")
	}
	names, err := t.names(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		mw, err := t.Middleware(ctx, name)
		if err == nil {
			if err = fn(ctx, name, mw); err != nil {
				err = &TenantError{Tenant: name, Err: err}
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// names returns the tenants Each runs over, sorted and without repeats.
func (t *Tenants) names(ctx context.Context) ([]string, error) {
	var names []string
	if t.cfg.List != nil {
		listed, err := t.cfg.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("idempotent: Tenants: list the tenants: %w", err)
		}
		names = append(names, listed...)
	} else {
		// Every tenant a message named, its database opened or not.
		t.mu.Lock()
		for name := range t.tenants {
			names = append(names, name)
		}
		t.mu.Unlock()
	}
	sort.Strings(names)
	out := names[:0]
	for i, n := range names {
		if n == "" {
			return nil, errors.New("idempotent: Tenants: TenantsConfig.List returned an empty tenant name")
		}
		if i == 0 || n != names[i-1] {
			out = append(out, n)
		}
	}
	return out, nil
}

// Close closes every tenant database the Tenants opened and makes later
// calls fail with ErrTenantsClosed. Transactions in progress finish first
// (sql.DB.Close waits for none, but their connections close as they are
// released). It returns the failures joined.
func (t *Tenants) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	entries := t.tenants
	t.tenants = map[string]*tenantEntry{}
	t.mu.Unlock()
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		e := entries[name]
		e.mu.Lock()
		if e.db != nil {
			if err := e.db.Close(); err != nil {
				errs = append(errs, &TenantError{Tenant: name, Err: fmt.Errorf("close: %w", err)})
			}
		}
		e.mu.Unlock()
	}
	return errors.Join(errs...)
}

// TenantError is a failure of one tenant's database or of the work on it.
type TenantError struct {
	// Tenant is the tenant's name.
	Tenant string
	// Err is the failure.
	Err error
}

// Error names the tenant.
func (e *TenantError) Error() string {
	return fmt.Sprintf("idempotent: tenant %q: %v", e.Tenant, e.Err)
}

// Unwrap returns the failure.
func (e *TenantError) Unwrap() error { return e.Err }

// noDatabase is a connector that refuses every connection: the database of
// the Middleware NewTenants builds only to check its options.
type noDatabase struct{}

func (noDatabase) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("idempotent: Tenants: no database (the options' check opens none)")
}

func (noDatabase) Driver() driver.Driver { return noDriver{} }

type noDriver struct{}

func (noDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("idempotent: Tenants: no database (the options' check opens none)")
}
