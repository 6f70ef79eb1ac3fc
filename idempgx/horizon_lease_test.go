package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// TestCleanupHonoursHorizonLease: a Middleware made WithHorizonLease caches
// the horizon and claims with the plain claim; a cleanup that raises the
// horizon meanwhile waits for the lease before deleting. The replay of a
// message whose claim the cleanup is about to delete, sent while the
// cleanup waits, meets the claim (a duplicate); the cleanup, stopped in its
// wait, has deleted nothing. Had the cleanup ignored the lease, it would
// have deleted the claim and the replay would apply again. A message older
// than the cached horizon is refused from the cache.
func TestCleanupHonoursHorizonLease(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, p *pgxpool.Pool, s, table string) {
		ctx := context.Background()
		start := time.Now()
		var clock atomic.Pointer[time.Time]
		clock.Store(&start)
		now := func() time.Time { return *clock.Load() }
		m, err := idempgx.New(p, "orders", idempgx.WithTable(table), idempgx.WithRetention(30*24*time.Hour),
			idempgx.WithClock(now), idempgx.WithHorizonLease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		replay := idempotent.Message{Key: "replay", EventTime: start.Add(-10 * 24 * time.Hour)}
		if o, err := m.ProcessMessage(ctx, replay, bump(s, replay.Key)); err != nil || o != idempotent.Applied {
			t.Fatalf("first delivery: %v, %v", o, err)
		}
		later := start.Add(8 * 24 * time.Hour)
		clock.Store(&later)
		// The cache as the cleanup begins: no horizon yet.
		if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "before", EventTime: later}, bump(s, "before")); err != nil || o != idempotent.Applied {
			t.Fatalf("a fresh message: %v, %v", o, err)
		}

		ct := claimTable(t, p, idempotent.WithTable(table), idempotent.WithRetention(7*24*time.Hour), idempotent.WithClock(func() time.Time { return later }))
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := ct.Cleanup(cctx, idempotent.DefaultCleanupOptions())
			done <- result{n, err}
		}()
		waitFor(t, "the cleanup to raise the horizon", func() bool {
			hs, err := ct.Horizons(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return len(hs) > 0 && hs[0].ForgottenBefore.After(replay.EventTime)
		})
		o, err := m.ProcessMessage(ctx, replay, bump(s, replay.Key))
		if o == idempotent.Applied || (err != nil && !errors.Is(err, idempotent.ErrBeyondRetention)) {
			t.Fatalf("the replay during the cleanup's wait: %v, %v; want a duplicate or ErrBeyondRetention", o, err)
		}
		cancel()
		r := <-done
		// Stopped in the lease's wait, which comes before anything else the
		// cleanup waits for: a cleanup found anywhere else ignored the lease.
		if r.n != 0 || !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "horizon leases") {
			t.Fatalf("the cleanup stopped during its wait: %d, %v; want nothing deleted, in the wait for the horizon leases", r.n, r.err)
		}
		if n := count(t, p, "SELECT coalesce(sum(n), 0) FROM "+s+".effects WHERE id = 'replay'"); n != 1 {
			t.Fatalf("the replayed message applied %d times, want once", n)
		}

		// A Middleware whose cache holds the raised horizon refuses the
		// replay from it.
		m2, err := idempgx.New(p, "orders", idempgx.WithTable(table), idempgx.WithRetention(30*24*time.Hour),
			idempgx.WithClock(now), idempgx.WithHorizonLease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if o, err := m2.ProcessMessage(ctx, replay, bump(s, replay.Key)); o == idempotent.Applied || !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Fatalf("replay older than the cached horizon: %v, %v; want ErrBeyondRetention", o, err)
		}
	})
}

// TestHorizonLeaseOptions: a lease out of range is refused at construction.
func TestHorizonLeaseOptions(t *testing.T) {
	p := newPool(t, 1)
	for _, d := range []time.Duration{0, time.Microsecond, 11 * time.Minute} {
		if _, err := idempgx.New(p, "orders", idempgx.WithHorizonLease(d)); err == nil || !strings.Contains(err.Error(), "WithHorizonLease") {
			t.Errorf("WithHorizonLease(%v): %v, want a refusal naming the option", d, err)
		}
	}
}
