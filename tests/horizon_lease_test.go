package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
)

// leaseFixture applies the order order of customer, with an event time,
// on a Middleware with a 7-day window, then moves the clock 10 days on.
func leaseFixture(t *testing.T, order, customer int64) (*loyalty, *testenv.Clock, orderCompleted, time.Time, func(orderCompleted) idempotent.TxFunc) {
	t.Helper()
	l, clock := fenceFixture(t, idempotent.WithRetention(7*day))
	msg := orderCompleted{OrderID: order, CustomerID: customer, TotalCents: 5000}
	at := clock.Now()
	apply := func(o orderCompleted) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, o) }
	}
	if got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key(), EventTime: at}, apply(msg)); got != idempotent.Applied || err != nil {
		t.Fatalf("first delivery = (%v, %v)", got, err)
	}
	clock.Add(10 * day)
	return l, clock, msg, at, apply
}

// TestCleanupHonoursHorizonLease: a process made WithHorizonLease caches the
// horizon and claims with the plain statement; a cleanup that raises the
// horizon meanwhile must not delete what the cached horizon still lets
// through until the lease has run out. The replay of a message whose claim
// the cleanup is about to delete, sent by the process while the cleanup
// waits, meets the claim (a duplicate), and the cleanup, stopped during its
// wait, has deleted nothing. A cleanup that ignored the lease would delete
// the claim first and the replay would apply again.
func TestCleanupHonoursHorizonLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock, msg, at, apply := leaseFixture(t, 7701, 3)
	// The leased process, whose window (30 days) still lets the message
	// through: it caches the horizon (none yet) on its first message.
	p := horizonMiddleware(t, l, clock, idempotent.WithRetention(30*day), idempotent.WithHorizonLease(time.Minute))
	other := orderCompleted{OrderID: 7702, CustomerID: 4, TotalCents: 5000}
	if got, err := p.ProcessMessage(ctx, idempotent.Message{Key: other.key(), EventTime: clock.Now()}, apply(other)); got != idempotent.Applied || err != nil {
		t.Fatalf("the leased process's first message = (%v, %v)", got, err)
	}

	short := horizonTable(t, l, clock, idempotent.WithRetention(7*day))
	stop := cleanupInLeaseWait(t, short, at)
	got, err := p.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply(msg))
	if got == idempotent.Applied || (err != nil && !errors.Is(err, idempotent.ErrBeyondRetention)) {
		t.Fatalf("the replay during the cleanup's wait = (%v, %v), want a duplicate or ErrBeyondRetention", got, err)
	}
	stop()
	if b, rows := l.balance(t, 3), l.ledgerRows(t, msg.OrderID); b != 50 || rows != 1 {
		t.Fatalf("balance %d and %d ledger rows, want 50 and 1", b, rows)
	}
	// The lease row is not a horizon.
	hs, err := short.Horizons(ctx)
	if err != nil || len(hs) != 1 || hs[0].Consumer != "" {
		t.Fatalf("Horizons = (%v, %v), want the table's row only", hs, err)
	}
}

// TestHorizonLeaseRefusesFromTheCache: a message older than the cached
// horizon is refused without a claim, as the fenced claim refuses it.
func TestHorizonLeaseRefusesFromTheCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock, msg, at, apply := leaseFixture(t, 7711, 5)
	short := horizonTable(t, l, clock, idempotent.WithRetention(7*day))
	if n, err := short.Cleanup(ctx, idempotent.DefaultCleanupOptions()); n != 1 || err != nil {
		t.Fatalf("Cleanup = (%d, %v), want the one claim", n, err)
	}
	p := horizonMiddleware(t, l, clock, idempotent.WithRetention(30*day), idempotent.WithHorizonLease(time.Minute))
	got, err := p.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: at}, apply(msg))
	if got == idempotent.Applied || !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("replay of a forgotten message = (%v, %v), want ErrBeyondRetention", got, err)
	}
	if b := l.balance(t, 5); b != 50 {
		t.Fatalf("balance %d, want 50", b)
	}
}

// cleanupInLeaseWait starts ct's Cleanup and returns once it has raised
// the table's horizon past at; stop cancels it and checks that it stopped
// in its wait for the horizon leases, having deleted nothing (a cleanup
// stopped anywhere else ignored the lease).
func cleanupInLeaseWait(t *testing.T, ct *idempotent.ClaimTable, at time.Time) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := ct.Cleanup(ctx, idempotent.DefaultCleanupOptions())
		done <- result{n, err}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		hs, err := ct.Horizons(context.Background())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if len(hs) > 0 && hs[0].Consumer == "" && hs[0].ForgottenBefore.After(at) {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the cleanup ended (%d, %v) before the horizon was seen raised", r.n, r.err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("the cleanup did not raise the horizon within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
	return func() {
		t.Helper()
		cancel()
		r := <-done
		if r.n != 0 || !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "horizon leases") {
			t.Fatalf("the cleanup stopped during its wait = (%d, %v), want nothing deleted, in the wait for the horizon leases", r.n, r.err)
		}
	}
}
