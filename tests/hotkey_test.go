package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// stalledHolder runs Process for msg with a handler that credits the
// order, reports its backend's pid, then stalls until release is closed
// (or, with release nil, sleeps in the database until its backend is
// killed). It returns a channel with the pid and one with Process's result.
// If the test ends first, Cleanup cancels the holder and waits for it, so a
// failing test does not leave a transaction holding the claim.
func stalledHolder(t *testing.T, mw *idempotent.Middleware, l *loyalty, msg orderCompleted, release <-chan struct{}) (<-chan int, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pids := make(chan int, 1)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
			if err := l.credit(ctx, tx, msg); err != nil {
				return err
			}
			var pid int
			if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			if release != nil {
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			_, err := tx.ExecContext(ctx, "SELECT pg_sleep(60)")
			return err
		})
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return pids, done
}

// waitForLockWaiters waits until n backends wait on a lock while inserting
// into the schema's claim table.
func waitForLockWaiters(t *testing.T, db *sql.DB, schema string, n int) {
	t.Helper()
	pattern := "%INSERT INTO " + pq.QuoteIdentifier(schema) + ".%" // the claim, whatever precedes it
	for deadline := time.Now().Add(30 * time.Second); ; {
		var got int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries waiting on the claim, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStalledHolderMakesDuplicatesBusy shows a hot key held by a stalled
// handler: duplicates behind it give up with ErrClaimBusy after the lock
// timeout, without running their handler or writing anything; when the
// holder finishes, the message has been applied exactly once, and later
// duplicates are Duplicate.
func TestStalledHolderMakesDuplicatesBusy(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(8)
	l := newLoyalty(t, db, idempotent.WithLockTimeout(200*time.Millisecond))
	msg := orderCompleted{OrderID: 4242, CustomerID: 9, TotalCents: 7000}
	release := make(chan struct{})
	pids, holder := stalledHolder(t, l.mw, l, msg, release)
	select {
	case <-pids:
	case err := <-holder:
		t.Fatalf("holder ended before stalling: %v", err)
	}

	const dups = 4
	var wg sync.WaitGroup
	errs := make([]error, dups)
	ran := make([]bool, dups)
	for i := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
				ran[i] = true
				return l.credit(ctx, tx, msg)
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, idempotent.ErrClaimBusy) || ran[i] {
			t.Fatalf("duplicate %d behind a stalled holder: %v (handler ran: %v), want ErrClaimBusy and no handler", i+1, err, ran[i])
		}
	}
	if n := l.ledgerRows(t, msg.OrderID); n != 0 {
		t.Fatalf("%d ledger rows while the holder is uncommitted, want 0", n)
	}

	close(release)
	if err := <-holder; err != nil {
		t.Fatalf("holder: %v", err)
	}
	for i := range 2 {
		got, err := l.handle(context.Background(), msg)
		if err != nil || got != idempotent.Duplicate {
			t.Fatalf("redelivery %d after the holder committed: (%v, %v), want duplicate", i+1, got, err)
		}
	}
	if n := l.ledgerRows(t, msg.OrderID); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
		t.Fatalf("balance %d, want %d", b, pointsFor(msg))
	}
}

// TestDeadHolderIsTakenOver shows a hot key whose holder dies — its
// backend is terminated while the handler stalls, and it does not retry, as
// a crashed consumer would not. Its claim and effect roll back together, so
// the message is applied exactly once by whoever comes next: the duplicate
// that was waiting behind it takes over, or, with none waiting, the next
// redelivery applies it. A later duplicate is Duplicate.
func TestDeadHolderIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, waiting := range []bool{true, false} {
		t.Run(fmt.Sprintf("waiting duplicate %v", waiting), func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			db.SetMaxOpenConns(8)
			l := newLoyalty(t, db)
			dead, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(l.mw.Config().Table),
				idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1}))
			if err != nil {
				t.Fatal(err)
			}
			msg := orderCompleted{OrderID: 777, CustomerID: 3, TotalCents: 12300}
			pids, holder := stalledHolder(t, dead, l, msg, nil)
			var pid int
			select {
			case pid = <-pids:
			case err := <-holder:
				t.Fatalf("holder ended before stalling: %v", err)
			}

			type result struct {
				outcome idempotent.Outcome
				err     error
			}
			waiter := make(chan result, 1)
			if waiting {
				go func() {
					o, err := l.handle(context.Background(), msg)
					waiter <- result{o, err}
				}()
				waitForLockWaiters(t, db, l.schema, 1)
			}

			var killed bool
			if err := db.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
				t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, killed, err)
			}
			if err := <-holder; err == nil {
				t.Fatal("the killed holder's Process returned no error")
			} else if postgres.New().Classify(err).Kind != dialect.KindConnection {
				t.Fatalf("the killed holder's error is not a lost connection: %v", err)
			}
			if !waiting {
				if n := l.ledgerRows(t, msg.OrderID); n != 0 {
					t.Fatalf("%d ledger rows after the holder died, want 0", n)
				}
				o, err := l.handle(context.Background(), msg)
				waiter <- result{o, err}
			}
			if r := <-waiter; r.err != nil || r.outcome != idempotent.Applied {
				t.Fatalf("the delivery after the dead holder: (%v, %v), want applied", r.outcome, r.err)
			}
			got, err := l.handle(context.Background(), msg)
			if err != nil || got != idempotent.Duplicate {
				t.Fatalf("later duplicate: (%v, %v), want duplicate", got, err)
			}
			if n := l.ledgerRows(t, msg.OrderID); n != 1 {
				t.Fatalf("%d ledger rows, want 1", n)
			}
			if b := l.balance(t, msg.CustomerID); b != pointsFor(msg) {
				t.Fatalf("balance %d, want %d", b, pointsFor(msg))
			}
		})
	}
}
