package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/sqlite"
)

// TestCleanupHonoursHorizonLeaseSQLite is TestCleanupHonoursHorizonLease on
// SQLite, a dialect that reads the horizon after the insert and has no
// snapshot drain: the lease's wait alone keeps the cleanup from deleting
// what a cached horizon still lets through.
func TestCleanupHonoursHorizonLeaseSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "lease.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec("CREATE TABLE effects (k TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	clock := testenv.NewClock(time.Now())
	newMW := func(opts ...idempotent.Option) *idempotent.Middleware {
		mw, err := idempotent.New(db, sqlite.New(), "loyalty", append([]idempotent.Option{idempotent.WithClock(clock.Now)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	first := newMW(idempotent.WithRetention(7 * day))
	if err := first.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	apply := func(k string) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (k) VALUES (?)", k)
			return err
		}
	}
	at := clock.Now()
	replay := idempotent.Message{Key: "replay", EventTime: at}
	if o, err := first.ProcessMessage(ctx, replay, apply("replay")); o != idempotent.Applied || err != nil {
		t.Fatalf("first delivery = (%v, %v)", o, err)
	}
	clock.Add(10 * day)
	p := newMW(idempotent.WithRetention(30*day), idempotent.WithHorizonLease(time.Minute))
	if o, err := p.ProcessMessage(ctx, idempotent.Message{Key: "other", EventTime: clock.Now()}, apply("other")); o != idempotent.Applied || err != nil {
		t.Fatalf("the leased process's first message = (%v, %v)", o, err)
	}
	ct, err := idempotent.NewClaimTable(db, sqlite.New(), idempotent.WithRetention(7*day), idempotent.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
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
	deadline := time.Now().Add(time.Minute)
	for {
		hs, err := ct.Horizons(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) > 0 && hs[0].ForgottenBefore.After(at) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cleanup did not raise the horizon within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
	o, err := p.ProcessMessage(ctx, replay, apply("replay"))
	if o == idempotent.Applied || (err != nil && !errors.Is(err, idempotent.ErrBeyondRetention)) {
		t.Fatalf("the replay during the cleanup's wait = (%v, %v), want a duplicate or ErrBeyondRetention", o, err)
	}
	cancel()
	r := <-done
	if r.n != 0 || !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "horizon leases") {
		t.Fatalf("the cleanup stopped during its wait = (%d, %v), want nothing deleted, in the wait for the horizon leases", r.n, r.err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM effects WHERE k = 'replay'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the replay applied %d times (%v), want once", n, err)
	}
}
