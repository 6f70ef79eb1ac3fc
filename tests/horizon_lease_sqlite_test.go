package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
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
	stop := cleanupInLeaseWait(t, ct, at)
	o, err := p.ProcessMessage(ctx, replay, apply("replay"))
	if o == idempotent.Applied || (err != nil && !errors.Is(err, idempotent.ErrBeyondRetention)) {
		t.Fatalf("the replay during the cleanup's wait = (%v, %v), want a duplicate or ErrBeyondRetention", o, err)
	}
	stop()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM effects WHERE k = 'replay'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the replay applied %d times (%v), want once", n, err)
	}
}
