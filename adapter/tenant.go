package adapter

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/txclaim/idempotent"
)

// SetTenant routes each delivery to its tenant's Middleware in ts (the
// WithTenant option): tenant names the delivery's tenant, from a header or
// the payload. The adapter's constructor is then given a nil Middleware.
// A delivery whose tenant cannot be read is poison (ErrPoison, with
// tenant's error); a delivery whose tenant database cannot be reached is
// requeued like any transaction failure, and the other tenants' deliveries
// go on. A batch is split by tenant (Config.ProcessBatch).
func (c *Config[T]) SetTenant(ts *idempotent.Tenants, tenant func(msg T) (string, error)) error {
	if ts == nil || tenant == nil {
		return errors.New("WithTenant: nil Tenants or tenant function")
	}
	if c.tenants != nil {
		return errors.New("WithTenant: given twice")
	}
	c.tenants, c.tenantOf = ts, tenant
	return nil
}

// Tenant returns the tenant of delivery msg, "" without a tenant function.
// An error is poison: it matches ErrPoison and names the adapter.
func (c *Config[T]) Tenant(msg T) (string, error) {
	if c.tenantOf == nil {
		return "", nil
	}
	name, err := c.tenantOf(msg)
	if err == nil && name == "" {
		err = errors.New("empty tenant")
	}
	if err != nil {
		if errors.Is(err, ErrPoison) {
			return "", fmt.Errorf("%s: tenant: %w", c.tr.Name, err)
		}
		return "", fmt.Errorf("%s: %w: tenant function: %w", c.tr.Name, ErrPoison, err)
	}
	return name, nil
}

// Middleware returns the Middleware for delivery msg: mw without a tenant
// function, else the delivery's tenant's (idempotent.Tenants.Middleware).
func (c *Config[T]) Middleware(ctx context.Context, mw *idempotent.Middleware, msg T) (*idempotent.Middleware, error) {
	if c.tenants == nil {
		return mw, nil
	}
	name, err := c.Tenant(msg)
	if err != nil {
		return nil, err
	}
	return c.tenants.Middleware(ctx, name)
}

// Process runs one delivery, msg read as m (Config.Message), through its
// Middleware (Config.Middleware): mw.ProcessMessage(ctx, m, fn) without a
// tenant function.
func (c *Config[T]) Process(ctx context.Context, mw *idempotent.Middleware, msg T, m idempotent.Message, fn idempotent.TxFunc) (idempotent.Outcome, error) {
	tm, err := c.Middleware(ctx, mw, msg)
	if err != nil {
		return 0, err
	}
	return tm.ProcessMessage(ctx, m, fn)
}

// ProcessBatch is the package's ProcessBatch over mw, or, with a tenant
// function, over each tenant's part of the batch with that tenant's
// Middleware: each part is claimed and committed in a transaction of its
// own, the parts at the same time (h is then called concurrently, once per
// tenant with new deliveries), so a tenant whose database is down fails,
// and is requeued, alone, and holds back no other tenant. A delivery whose
// tenant cannot be read gets the poison error of Config.Tenant. The
// Results are in the order of ds.
func (c *Config[T]) ProcessBatch(ctx context.Context, mw *idempotent.Middleware, ds []T, msgs []idempotent.Message, errs []error, h func(ctx context.Context, tx *sql.Tx, fresh []T) error) []Result {
	if c.tenants == nil {
		return ProcessBatch(ctx, mw, ds, msgs, errs, h)
	}
	res := make([]Result, len(ds))
	parts := map[string][]int{} // tenant → indexes in ds
	var order []string
	for i, d := range ds {
		if errs != nil && errs[i] != nil {
			res[i].Err = errs[i]
			continue
		}
		name, err := c.Tenant(d)
		if err != nil {
			res[i].Err = err
			continue
		}
		if _, ok := parts[name]; !ok {
			order = append(order, name)
		}
		parts[name] = append(parts[name], i)
	}
	var wg sync.WaitGroup
	for _, name := range order {
		idx := parts[name]
		wg.Add(1)
		go func() {
			defer wg.Done()
			tm, err := c.tenants.Middleware(ctx, name)
			if err != nil {
				for _, i := range idx {
					res[i].Err = err
				}
				return
			}
			pds := make([]T, len(idx))
			pmsgs := make([]idempotent.Message, len(idx))
			for j, i := range idx {
				pds[j], pmsgs[j] = ds[i], msgs[i]
			}
			for j, r := range ProcessBatch(ctx, tm, pds, pmsgs, nil, h) {
				res[idx[j]] = r
			}
		}()
	}
	wg.Wait()
	return res
}
