// Package horizonlease is the cache of a claim table's retention horizon
// that a Middleware made WithHorizonLease keeps, shared by the database/sql
// path (package idempotent) and the pgx path (idempgx), and the reserved
// row of the horizon table in which such a Middleware declares its lease.
//
// The argument (docs/operations.md, "The horizon under a lease"): a
// process declares its lease L in the database (Row, raised only) before
// it first caches the horizon. It caches a horizon read that began at t0,
// and relies on it for a claim only when the claim statement returned
// before t0 + L/2 on its own monotonic clock; otherwise it reads the
// horizon again in the claim's transaction, after the insert. A cleanup
// raises the horizon, commits, then reads the largest lease declared and
// waits that long before it deletes anything. A cached horizon that misses
// a raise was read before the raise committed, so every claim relying on
// it ran before the raise plus L/2, before any deletion the raise allows:
// such a claim finds the old claim and is a duplicate.
package horizonlease

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Row is the consumer name of the horizon table's row in which processes
// declare their lease, as a time that many microseconds after the Unix
// epoch. No consumer can have it: a consumer name starts with a letter or
// a digit. The row only rises (AdvanceHorizonSQL), so a cleanup waits for
// the longest lease ever declared on the table.
const Row = "/lease"

// Max is the longest lease a Middleware may declare: every cleanup of the
// table waits for it once the horizon is raised.
const Max = 10 * time.Minute

// Check reports a lease Middleware options refuse.
func Check(d time.Duration) error {
	if d < time.Millisecond || d > Max {
		return errors.New("the lease must be from 1ms to 10m (every cleanup of the table waits for it)")
	}
	return nil
}

// Encode is lease d as the time stored in Row.
func Encode(d time.Duration) time.Time { return time.UnixMicro(d.Microseconds()).UTC() }

// Decode is the lease stored in Row as microseconds since the epoch.
func Decode(micros int64) time.Duration { return time.Duration(micros) * time.Microsecond }

// Snapshot is a cached horizon: micros since the Unix epoch when OK, and
// the monotonic time its read began.
type Snapshot struct {
	Micros int64
	OK     bool
	ReadAt time.Time
}

// Cache is one Middleware's cached horizon. Its zero value is not usable:
// set Lease, Declare and Read.
type Cache struct {
	Lease time.Duration
	// Declare raises Row to at least Lease, committed, before the first
	// read.
	Declare func(ctx context.Context) error
	// Read reads the consumer's horizon (the later of its row and the
	// table's), outside any transaction of a claim.
	Read func(ctx context.Context) (micros int64, ok bool, err error)

	mu       sync.Mutex
	declared bool
	snap     Snapshot
	have     bool
}

// Refresh reads the horizon again (declaring the lease first, once) when
// a claim could no longer rely on the cached one: none yet, or a quarter
// of the lease gone. Call it outside any transaction of the caller's, before
// the claim's transaction begins: it runs its statements on the pool.
func (c *Cache) Refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.have && time.Since(c.snap.ReadAt) < c.Lease/4 {
		return nil
	}
	if !c.declared {
		if err := c.Declare(ctx); err != nil {
			return err
		}
		c.declared = true
	}
	start := time.Now()
	h, ok, err := c.Read(ctx)
	if err != nil {
		return err
	}
	c.snap, c.have = Snapshot{Micros: h, OK: ok, ReadAt: start}, true
	return nil
}

// Peek returns the cached horizon when a claim sent now may rely on it
// (Fresh), without reading anything; false tells the claim to read the
// horizon itself, as without a lease.
func (c *Cache) Peek() (Snapshot, bool) {
	c.mu.Lock()
	s, have := c.snap, c.have
	c.mu.Unlock()
	return s, have && c.Fresh(s)
}

// Fresh reports whether a claim statement that has returned by now may rely
// on s: less than half the lease has passed since s's read began.
func (c *Cache) Fresh(s Snapshot) bool { return time.Since(s.ReadAt) < c.Lease/2 }

// Wait sleeps d, or until ctx ends.
func Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
