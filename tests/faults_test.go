package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// Each fault is tried in two modes: the middleware's own retry recovers
// ("retried"), or, with retries off, the caller gets an error and the broker
// redelivers ("redelivered"). Either way the effect lands exactly once.
var faultModes = []struct {
	name     string
	attempts int
}{{"retried", 5}, {"redelivered", 1}}

// A backend killed with pg_terminate_backend in the middle of the handler:
// nothing was committed, so the retry (or the redelivery) applies.
func TestBackendKilledMidHandler(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, mode := range faultModes {
			t.Run(drv+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				db := openGuarded(t, drv, 3)
				mon := openMonitor(t)
				rec := &recorder{}
				l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(mode.attempts)), idempotent.WithObserver(rec))
				msg := orderCompleted{OrderID: 66, CustomerID: 6, TotalCents: 6600}
				q := pq.QuoteIdentifier(l.schema)
				calls := 0
				handler := func(ctx context.Context, tx *sql.Tx) error {
					calls++
					if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", pointsFor(msg), msg.CustomerID); err != nil {
						return err
					}
					if calls == 1 {
						pid, err := backendPID(ctx, tx)
						if err != nil {
							return err
						}
						terminate(t, mon, pid)
					}
					_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)", msg.CustomerID, msg.OrderID, pointsFor(msg))
					if calls == 1 {
						t.Logf("statement after the kill: %v (%T, SQLSTATE %q)", err, err, sqlState(err))
					}
					return err
				}
				got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler)
				if mode.attempts > 1 {
					if err != nil || got != idempotent.Applied || calls != 2 {
						t.Fatalf("(%v, %v) after %d handler runs; want applied after 2", got, err, calls)
					}
					if r := rec.retryReasons(); !slices.Equal(r, []string{"connection"}) {
						t.Errorf("retries %v, want one for the lost connection", r)
					}
				} else {
					if err == nil {
						t.Fatalf("Process with a killed backend and no retry succeeded: %v", got)
					}
					t.Logf("error returned: %v", err)
					if n := claims(t, mon, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
						t.Fatalf("%d claims after the kill, want 0", n)
					}
					if got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler); err != nil || got != idempotent.Applied {
						t.Fatalf("redelivery: (%v, %v), want applied", got, err)
					}
				}
				if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
					t.Errorf("balance %d, want %d", b, pointsFor(msg))
				}
				if n := l.ledgerRows(t, msg.OrderID); n != 1 {
					t.Errorf("%d ledger rows, want 1", n)
				}
			})
		}
	}
}

// slowCommit adds a deferred constraint trigger on the ledger that, at
// COMMIT, waits for an advisory lock the test holds: COMMIT blocks until the
// test lets it go. It returns the function that lets it go (idempotent).
func slowCommit(t *testing.T, db, mon *sql.DB, schema string) (release func()) {
	t.Helper()
	q := pq.QuoteIdentifier(schema)
	key := time.Now().UnixNano()
	if _, err := db.Exec(fmt.Sprintf(`
CREATE FUNCTION %[1]s.wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock(TG_ARGV[0]::bigint);
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER wait_at_commit AFTER INSERT ON %[1]s.point_ledger
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s.wait_at_commit('%[2]d');`, q, key)); err != nil {
		t.Fatal(err)
	}
	conn, err := mon.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		if _, err := conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", key); err != nil {
			t.Errorf("advisory unlock: %v", err)
		}
		_ = conn.Close()
	}
	t.Cleanup(release)
	return release
}

// A backend killed while it runs COMMIT (blocked in a deferred trigger):
// the commit did not land, and the retry (or the redelivery) applies once.
func TestBackendKilledDuringCommit(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, mode := range faultModes {
			t.Run(drv+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				db := openGuarded(t, drv, 3)
				mon := openMonitor(t)
				rec := &recorder{}
				l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(mode.attempts)), idempotent.WithObserver(rec))
				release := slowCommit(t, db, mon, l.schema)
				msg := orderCompleted{OrderID: 67, CustomerID: 6, TotalCents: 6700}
				pids := make(chan int, 1)
				calls := 0
				handler := func(ctx context.Context, tx *sql.Tx) error {
					calls++
					if calls == 1 {
						pid, err := backendPID(ctx, tx)
						if err != nil {
							return err
						}
						pids <- pid
					}
					return l.credit(ctx, tx, msg)
				}
				type result struct {
					o   idempotent.Outcome
					err error
				}
				done := make(chan result, 1)
				go func() {
					o, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler)
					done <- result{o, err}
				}()
				pid := <-pids
				waitFor(t, "COMMIT to block in the deferred trigger", func() (bool, error) {
					var n int
					err := mon.QueryRow(`SELECT count(*) FROM pg_stat_activity
						WHERE pid = $1 AND upper(query) = 'COMMIT' AND wait_event_type = 'Lock'`, pid).Scan(&n)
					return n == 1, err
				})
				terminate(t, mon, pid)
				release()
				r := <-done
				if mode.attempts > 1 {
					if r.err != nil || r.o != idempotent.Applied || calls != 2 {
						t.Fatalf("(%v, %v) after %d handler runs; want applied after 2", r.o, r.err, calls)
					}
					if reasons := rec.retryReasons(); !slices.Equal(reasons, []string{"connection"}) {
						t.Errorf("retries %v, want one for the lost connection", reasons)
					}
				} else {
					if r.err == nil {
						t.Fatalf("Process whose COMMIT was killed, with no retry, succeeded: %v", r.o)
					}
					t.Logf("error returned: %v", r.err)
					if n := claims(t, mon, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
						t.Fatalf("%d claims after the killed COMMIT, want 0", n)
					}
					if got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler); err != nil || got != idempotent.Applied {
						t.Fatalf("redelivery: (%v, %v), want applied", got, err)
					}
				}
				if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
					t.Errorf("balance %d, want %d", b, pointsFor(msg))
				}
				if n := l.ledgerRows(t, msg.OrderID); n != 1 {
					t.Errorf("%d ledger rows, want 1", n)
				}
			})
		}
	}
}

// The ambiguous commit: COMMIT lands on the server, but the connection is
// cut before the client hears so. The retry (or the redelivery) finds the
// claim and reports a duplicate; the effect exists exactly once.
func TestAmbiguousCommit(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, mode := range faultModes {
			t.Run(drv+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				if pgDSN == "" {
					t.Skip(skipReason)
				}
				proxy := newCommitCutter(t, dsnHost(t, pgDSN))
				db := openGuardedDSN(t, drv, dsnWithHost(t, pgDSN, proxy.Addr()), 2)
				mon := openMonitor(t)
				rec := &recorder{}
				l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(mode.attempts)), idempotent.WithObserver(rec))
				msg := orderCompleted{OrderID: 68, CustomerID: 6, TotalCents: 6800}
				calls := 0
				handler := func(ctx context.Context, tx *sql.Tx) error {
					calls++
					if calls == 1 {
						proxy.Arm()
					}
					return l.credit(ctx, tx, msg)
				}
				got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler)
				if proxy.cut.Load() != 1 {
					t.Fatalf("the proxy cut %d commits, want 1", proxy.cut.Load())
				}
				if mode.attempts > 1 {
					if err != nil || got != idempotent.Duplicate {
						t.Fatalf("(%v, %v), want duplicate: the retry must find the landed claim", got, err)
					}
					if reasons := rec.retryReasons(); !slices.Equal(reasons, []string{"connection"}) {
						t.Errorf("retries %v, want one for the lost connection", reasons)
					}
				} else {
					if err == nil {
						t.Fatalf("Process with a lost COMMIT and no retry succeeded: %v", got)
					}
					t.Logf("error returned: %v", err)
					var re *idempotent.RetriesExhaustedError
					if !errors.As(err, &re) {
						t.Errorf("a lost COMMIT is retryable, so with no retries left the error should be a *RetriesExhaustedError: %v", err)
					}
					if n := claims(t, mon, l.schema+".processed_messages", "loyalty", msg.key()); n != 1 {
						t.Fatalf("%d claims: the cut COMMIT should have landed", n)
					}
					if got, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler); err != nil || got != idempotent.Duplicate {
						t.Fatalf("redelivery: (%v, %v), want duplicate", got, err)
					}
				}
				if calls != 1 {
					t.Errorf("handler ran %d times, want 1", calls)
				}
				if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
					t.Errorf("balance %d, want %d", b, pointsFor(msg))
				}
				if n := l.ledgerRows(t, msg.OrderID); n != 1 {
					t.Errorf("%d ledger rows, want 1", n)
				}
			})
		}
	}
}
