package tests

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// switchOnRetry is an Observer that records retries and, at the first one,
// turns the session's default_transaction_read_only off again: what a
// failover looks like from a consumer whose connection first reached a
// standby and, on its retry, the promoted primary.
type switchOnRetry struct {
	db      *sql.DB
	mu      sync.Mutex
	retries []idempotent.RetryEvent
	err     error
}

func (s *switchOnRetry) Outcome(context.Context, idempotent.Event) {}

func (s *switchOnRetry) Retry(_ context.Context, e idempotent.RetryEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retries = append(s.retries, e)
	if len(s.retries) == 1 {
		// No transaction is open during the backoff: the pool's one
		// connection is idle, and this runs on it.
		_, s.err = s.db.Exec("SET default_transaction_read_only = off")
	}
}

// TestStandbyReadOnlyIsRetried gives a consumer a session that refuses
// writes as a standby does (SQLSTATE 25006, read_only_sql_transaction) and
// checks that the message is retried as a connection-level failure and
// applied once when the session accepts writes again, instead of failing.
//
// It runs on pgx's stdlib, which begins with a plain BEGIN. lib/pq begins
// every transaction READ WRITE explicitly, which overrides the session's
// default here, and which a real standby refuses at BEGIN with 0A000
// (feature_not_supported, "cannot set transaction read-write mode during
// recovery"), also retried: TestPatroniStandbyIsRetried proves both on a
// Patroni cluster's standby.
func TestStandbyReadOnlyIsRetried(t *testing.T) {
	t.Parallel()
	for _, drv := range []string{"pgx"} {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 1)
			mon := openMonitor(t)
			name := tempSchema(t, mon)
			schema := pq.QuoteIdentifier(name)
			if _, err := mon.Exec("CREATE TABLE " + schema + ".effects (k text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			obs := &switchOnRetry{db: db}
			mw, err := idempotent.New(db, postgres.New(), "standby", idempotent.WithTable(name+".claims"), idempotent.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := mw.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			// The pool has one connection: the claim's transaction runs in
			// this session.
			if _, err := db.Exec("SET default_transaction_read_only = on"); err != nil {
				t.Fatal(err)
			}
			out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".effects VALUES ('order-1')")
				return err
			})
			if err != nil {
				t.Fatalf("ProcessMessage on a read-only session: %v (the message failed instead of being retried)", err)
			}
			if out != idempotent.Applied {
				t.Fatalf("outcome %v, want Applied", out)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if obs.err != nil {
				t.Fatal(obs.err)
			}
			if len(obs.retries) != 1 || obs.retries[0].Code != "25006" || obs.retries[0].Reason != "connection" {
				t.Fatalf("retries %+v, want one connection retry with code 25006", obs.retries)
			}
			var n int
			if err := mon.QueryRow("SELECT count(*) FROM " + schema + ".effects").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
		})
	}
}
