package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// fastRetry retries quickly so tests that exhaust it stay fast.
func fastRetry(n int) idempotent.RetryPolicy {
	return idempotent.RetryPolicy{MaxAttempts: n, InitialBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond}
}

// deliverConcurrently delivers msg n times at once, each on its own
// goroutine released by one gate, and returns every outcome and error.
func deliverConcurrently(l *loyalty, n int, msg orderCompleted) ([]idempotent.Outcome, []error) {
	outcomes := make([]idempotent.Outcome, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			outcomes[i], errs[i] = l.handle(context.Background(), msg)
		}()
	}
	close(gate)
	wg.Wait()
	return outcomes, errs
}

func tally(outcomes []idempotent.Outcome, errs []error) (applied, duplicate int, failures []error) {
	for i, o := range outcomes {
		switch {
		case errs[i] != nil:
			failures = append(failures, errs[i])
		case o == idempotent.Applied:
			applied++
		case o == idempotent.Duplicate:
			duplicate++
		}
	}
	return applied, duplicate, failures
}

// The guide's first Verification test: a redelivered message applies once.
func TestVerificationRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			l := newLoyalty(t, openGuarded(t, drv, 4))
			msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
			var ran int
			handle := func() (idempotent.Outcome, error) {
				return l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
					ran++
					return l.credit(ctx, tx, msg)
				})
			}
			if got, err := handle(); err != nil || got != idempotent.Applied {
				t.Fatalf("first delivery: (%v, %v), want applied", got, err)
			}
			if got, err := handle(); err != nil || got != idempotent.Duplicate {
				t.Fatalf("redelivery: (%v, %v), want duplicate", got, err)
			}
			if ran != 1 {
				t.Errorf("handler ran %d times, want 1 (a duplicate must not run it)", ran)
			}
			if b := l.balance(t, 7); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d", b, pointsFor(msg))
			}
			if n := l.ledgerRows(t, 9912); n != 1 {
				t.Errorf("%d ledger rows, want 1", n)
			}
		})
	}
}

// The guide's second Verification test: 8 concurrent deliveries of one
// message give one applied and seven duplicates.
func TestVerificationConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			l := newLoyalty(t, openGuarded(t, drv, 8))
			msg := orderCompleted{OrderID: 9913, CustomerID: 8, TotalCents: 1000}
			applied, dup, failures := tally(deliverConcurrently(l, 8, msg))
			if applied != 1 || dup != 7 || len(failures) != 0 {
				t.Fatalf("applied %d, duplicate %d, failed %v; want 1, 7, none", applied, dup, failures)
			}
			if b := l.balance(t, 8); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d", b, pointsFor(msg))
			}
			if n := l.ledgerRows(t, 9913); n != 1 {
				t.Errorf("%d ledger rows, want 1", n)
			}
		})
	}
}

// handlerError is a typed error a handler returns, to check that the
// middleware wraps rather than replaces it.
type handlerError struct{ order int64 }

func (e *handlerError) Error() string { return fmt.Sprintf("order %d: customer blocked", e.order) }

func TestHandlerErrorRollsBackClaimAndEffect(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 4)
	l := newLoyalty(t, db)
	msg := orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 700}
	_, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
		if err := l.credit(ctx, tx, msg); err != nil {
			return err
		}
		return &handlerError{order: msg.OrderID}
	})
	var he *handlerError
	if !errors.As(err, &he) || he.order != 1 {
		t.Fatalf("Process error %v does not wrap the handler's *handlerError", err)
	}
	if !strings.Contains(err.Error(), `"loyalty"`) || !strings.Contains(err.Error(), msg.key()) {
		t.Errorf("error %q does not name the consumer and key", err)
	}
	if errors.Is(err, idempotent.ErrRetriesExhausted) {
		t.Errorf("a handler error was retried: %v", err)
	}
	if n := claims(t, db, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
		t.Errorf("%d claims after the handler failed, want 0", n)
	}
	if b := l.balance(t, 1); b != 0 {
		t.Errorf("balance %d after the handler failed, want 0", b)
	}
	// The redelivery applies.
	if got, err := l.handle(context.Background(), msg); err != nil || got != idempotent.Applied {
		t.Fatalf("redelivery: (%v, %v), want applied", got, err)
	}
	if b := l.balance(t, 1); b != pointsFor(msg) {
		t.Errorf("balance %d, want %d", b, pointsFor(msg))
	}
}

// Step 3: T1 claims and holds; T2 waits on T1's uncommitted claim. If T1
// commits, T2 is a duplicate; if T1 rolls back, T2 takes over and applies.
func TestWaitingDuplicate(t *testing.T) {
	t.Parallel()
	for _, holderFails := range []bool{false, true} {
		name := "holder commits"
		if holderFails {
			name = "holder rolls back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, "pq", 4)
			mon := openMonitor(t)
			l := newLoyalty(t, db)
			msg := orderCompleted{OrderID: 42, CustomerID: 3, TotalCents: 4200}
			claimed := make(chan struct{})
			release := make(chan struct{})
			var once sync.Once
			letGo := func() { once.Do(func() { close(release) }) }
			t.Cleanup(letGo) // never leave the holder hanging on a failure
			errHolder := errors.New("holder crashed")
			type result struct {
				o   idempotent.Outcome
				err error
			}
			t1 := make(chan result, 1)
			go func() {
				o, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
					if err := l.credit(ctx, tx, msg); err != nil {
						return err
					}
					close(claimed)
					<-release
					if holderFails {
						return errHolder
					}
					return nil
				})
				t1 <- result{o, err}
			}()
			<-claimed
			var t2Ran atomic.Int32
			t2 := make(chan result, 1)
			go func() {
				o, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
					t2Ran.Add(1)
					return l.credit(ctx, tx, msg)
				})
				t2 <- result{o, err}
			}()
			// T2 is blocked on T1's uncommitted claim.
			waitLockWaiters(t, mon, l.schema, 1)
			letGo()
			r1, r2 := <-t1, <-t2
			if holderFails {
				if !errors.Is(r1.err, errHolder) {
					t.Fatalf("holder: %v, want its own error", r1.err)
				}
				if r2.err != nil || r2.o != idempotent.Applied || t2Ran.Load() != 1 {
					t.Fatalf("waiting duplicate: (%v, %v), ran %d; want applied, ran once", r2.o, r2.err, t2Ran.Load())
				}
			} else {
				if r1.err != nil || r1.o != idempotent.Applied {
					t.Fatalf("holder: (%v, %v), want applied", r1.o, r1.err)
				}
				if r2.err != nil || r2.o != idempotent.Duplicate || t2Ran.Load() != 0 {
					t.Fatalf("waiting duplicate: (%v, %v), ran %d; want duplicate, not run", r2.o, r2.err, t2Ran.Load())
				}
			}
			if b := l.balance(t, 3); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d (exactly once)", b, pointsFor(msg))
			}
		})
	}
}

// Under SERIALIZABLE, duplicates that waited on the first claim fail with
// 40001 when it commits; the middleware retries them and they end as
// duplicates, with no error surfaced.
func TestSerializableStorm(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			heavy(t)
			const n = 32
			db := openGuarded(t, drv, n)
			mon := openMonitor(t)
			var counts idempotent.Counts
			rec := &recorder{}
			l := newLoyalty(t, db,
				idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}),
				idempotent.WithObserver(multiObserver{&counts, rec}))
			msg := orderCompleted{OrderID: 77, CustomerID: 9, TotalCents: 12300}
			var ran atomic.Int32
			outcomes := make([]idempotent.Outcome, n)
			errs := make([]error, n)
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					outcomes[i], errs[i] = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
						if ran.Add(1) == 1 {
							// Hold the claim until the other 31 wait on it, so
							// that every one of them must be retried.
							if err := pollLockWaiters(ctx, mon, l.schema, n-1); err != nil {
								return err
							}
						}
						return l.credit(ctx, tx, msg)
					})
				}()
			}
			close(gate)
			wg.Wait()
			applied, dup, failures := tally(outcomes, errs)
			if applied != 1 || dup != n-1 || len(failures) != 0 {
				t.Fatalf("applied %d, duplicate %d, failed %v; want 1, %d, none", applied, dup, failures, n-1)
			}
			if b := l.balance(t, 9); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d", b, pointsFor(msg))
			}
			if counts.Applied() != 1 || counts.Duplicates() != n-1 || counts.Failed() != 0 {
				t.Errorf("Counts: applied %d, duplicates %d, failed %d", counts.Applied(), counts.Duplicates(), counts.Failed())
			}
			if counts.Retries() < n-1 {
				t.Errorf("%d retries observed, want at least %d (each waiter fails with 40001 once)", counts.Retries(), n-1)
			}
			for _, c := range rec.retryCodes() {
				if c != "40001" {
					t.Errorf("retry with SQLSTATE %q, want 40001", c)
				}
			}
			t.Logf("%s: %d retries, %d handler runs", drv, counts.Retries(), ran.Load())
		})
	}
}

// pollLockWaiters is waitLockWaiters for use off the test goroutine.
func pollLockWaiters(ctx context.Context, mon *sql.DB, marker string, n int) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var got int
		// context.Background: the handler's context is the claim's, and
		// the guard (rightly) refuses it on another connection.
		if err := mon.QueryRowContext(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, marker).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d backends waiting", got, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// multiObserver fans events out to several observers.
type multiObserver []idempotent.Observer

func (m multiObserver) Outcome(ctx context.Context, e idempotent.Event) {
	for _, o := range m {
		o.Outcome(ctx, e)
	}
}

func (m multiObserver) Retry(ctx context.Context, e idempotent.RetryEvent) {
	for _, o := range m {
		o.Retry(ctx, e)
	}
}

// barrier lets k goroutines wait for each other once.
type barrier struct {
	wg sync.WaitGroup
}

func newBarrier(k int) *barrier {
	b := &barrier{}
	b.wg.Add(k)
	return b
}

func (b *barrier) await() error {
	b.wg.Done()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(15 * time.Second):
		return errors.New("barrier: timed out")
	}
}

// A serialization failure in the handler's own statements (a real write skew
// under SERIALIZABLE) is retried, and the retry sees the other's commit.
func TestHandlerSerializationFailureRetried(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 4)
	rec := &recorder{}
	l := newLoyalty(t, db,
		idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}),
		idempotent.WithObserver(rec), idempotent.WithRetry(fastRetry(10)))
	q := pq.QuoteIdentifier(l.schema)
	if _, err := db.Exec("CREATE TABLE " + q + ".on_call (doctor int PRIMARY KEY, on_call bool NOT NULL); INSERT INTO " + q + ".on_call VALUES (1, true), (2, true)"); err != nil {
		t.Fatal(err)
	}
	// Each doctor goes off call if someone else is still on call: the
	// classic write skew. Serially, exactly one of them can.
	b := newBarrier(2)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	outcomes := make([]idempotent.Outcome, 3)
	for doctor := 1; doctor <= 2; doctor++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			attempt := 0
			outcomes[doctor], errs[doctor] = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: fmt.Sprintf("off-call:%d", doctor)}, func(ctx context.Context, tx *sql.Tx) error {
				attempt++
				var on int
				if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+q+".on_call WHERE on_call").Scan(&on); err != nil {
					return err
				}
				if attempt == 1 {
					if err := b.await(); err != nil {
						return err
					}
				}
				if on < 2 {
					return nil
				}
				_, err := tx.ExecContext(ctx, "UPDATE "+q+".on_call SET on_call = false WHERE doctor = $1", doctor)
				return err
			})
		}()
	}
	wg.Wait()
	for d := 1; d <= 2; d++ {
		if errs[d] != nil || outcomes[d] != idempotent.Applied {
			t.Fatalf("doctor %d: (%v, %v), want applied", d, outcomes[d], errs[d])
		}
	}
	if n := count(t, db, "SELECT count(*) FROM "+q+".on_call WHERE on_call"); n != 1 {
		t.Errorf("%d doctors on call, want 1 (the write skew was not retried)", n)
	}
	if codes := rec.retryCodes(); !slices.Contains(codes, "40001") {
		t.Errorf("retries %v, want a 40001", codes)
	}
}

// A deadlock between two handlers is retried: the victim runs again after
// the winner commits, and both apply exactly once.
func TestHandlerDeadlockRetried(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 4)
	mon := openMonitor(t)
	rec := &recorder{}
	l := newLoyalty(t, db, idempotent.WithObserver(rec), idempotent.WithRetry(fastRetry(10)))
	q := pq.QuoteIdentifier(l.schema)
	super := superuser(t, mon)
	b := newBarrier(2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	outcomes := make([]idempotent.Outcome, 2)
	for i := range 2 {
		first, second := int64(1+i), int64(2-i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			attempt := 0
			msg := fmt.Sprintf("transfer:%d", i)
			outcomes[i], errs[i] = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg}, func(ctx context.Context, tx *sql.Tx) error {
				attempt++
				if super {
					// Detect the deadlock in 20ms instead of the default 1s.
					if _, err := tx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '20ms'"); err != nil {
						return err
					}
				}
				for j, c := range []int64{first, second} {
					if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + 1 WHERE customer_id = $1", c); err != nil {
						return err
					}
					if j == 0 && attempt == 1 {
						if err := b.await(); err != nil {
							return err
						}
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || outcomes[i] != idempotent.Applied {
			t.Fatalf("transfer %d: (%v, %v), want applied", i, outcomes[i], errs[i])
		}
	}
	if p1, p2 := l.balance(t, 1), l.balance(t, 2); p1 != 2 || p2 != 2 {
		t.Errorf("balances %d and %d, want 2 and 2 (each transfer once)", p1, p2)
	}
	// Usually one transaction is chosen as the victim; on a loaded machine
	// both may be, once each. Either way every retry is a deadlock's.
	codes := rec.retryCodes()
	if len(codes) == 0 || len(codes) > 2 || slices.ContainsFunc(codes, func(c string) bool { return c != "40P01" }) {
		t.Errorf("retries %v, want one or two 40P01", codes)
	}
}

// raise runs a DO block that fails with the given SQLSTATE: a real error
// from the server, as the driver reports it.
func raise(ctx context.Context, tx *sql.Tx, code string) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'forced %[1]s' USING ERRCODE = '%[1]s'; END $$`, code))
	return err
}

func TestRetriesExhausted(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, "pq", 2)
			var counts idempotent.Counts
			l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(3)), idempotent.WithObserver(&counts))
			msg := orderCompleted{OrderID: 5, CustomerID: 5, TotalCents: 500}
			calls := 0
			_, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
				calls++
				if err := l.credit(ctx, tx, msg); err != nil {
					return err
				}
				return raise(ctx, tx, code)
			})
			if !errors.Is(err, idempotent.ErrRetriesExhausted) {
				t.Fatalf("error %v does not match ErrRetriesExhausted", err)
			}
			var re *idempotent.RetriesExhaustedError
			if !errors.As(err, &re) || re.Attempts != 3 {
				t.Fatalf("error %v: want a *RetriesExhaustedError after 3 attempts", err)
			}
			if got := sqlState(err); got != code {
				t.Errorf("SQLSTATE of the wrapped cause is %q, want %s", got, code)
			}
			var pqErr *pq.Error
			if !errors.As(err, &pqErr) {
				t.Errorf("the driver's *pq.Error is not reachable through %v", err)
			}
			if calls != 3 || counts.Retries() != 2 || counts.Failed() != 1 {
				t.Errorf("handler ran %d times with %d retries and %d failures, want 3, 2, 1", calls, counts.Retries(), counts.Failed())
			}
			if n := claims(t, db, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
				t.Errorf("%d claims, want 0", n)
			}
			if b := l.balance(t, 5); b != 0 {
				t.Errorf("balance %d, want 0", b)
			}
		})
	}
}

// Errors that are not serialization failures, deadlocks or lost connections
// are returned at once: 40003 (statement completion unknown) in particular.
func TestNoRetryOnOtherErrors(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	var counts idempotent.Counts
	l := newLoyalty(t, db, idempotent.WithRetry(fastRetry(5)), idempotent.WithObserver(&counts))
	for i, code := range []string{"40003", "23505", "22012", "55P03", "42P01"} {
		calls := 0
		key := fmt.Sprintf("no-retry:%d", i)
		_, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
			calls++
			return raise(ctx, tx, code)
		})
		if err == nil || sqlState(err) != code {
			t.Errorf("%s: error %v, want the SQLSTATE %s", code, err, code)
		}
		if errors.Is(err, idempotent.ErrRetriesExhausted) || calls != 1 {
			t.Errorf("%s: handler ran %d times (%v), want once with no retry", code, calls, err)
		}
		if errors.Is(err, idempotent.ErrClaimBusy) || errors.Is(err, idempotent.ErrNoClaimTable) {
			t.Errorf("%s in the handler was mistaken for the claim's own failure: %v", code, err)
		}
	}
	if counts.Retries() != 0 {
		t.Errorf("%d retries, want 0", counts.Retries())
	}
}

func TestPanicInHandler(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 2)
			l := newLoyalty(t, db)
			msg := orderCompleted{OrderID: 13, CustomerID: 13, TotalCents: 1300}
			type boom struct{ n int }
			pid := 0
			recovered := func() (r any) {
				defer func() { r = recover() }()
				_, _ = l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
					if err := l.credit(ctx, tx, msg); err != nil {
						return err
					}
					var err error
					if pid, err = backendPID(ctx, tx); err != nil {
						return err
					}
					panic(boom{13})
				})
				return nil
			}()
			if b, ok := recovered.(boom); !ok || b.n != 13 {
				t.Fatalf("recovered %v, want the handler's panic value", recovered)
			}
			if n := db.Stats().InUse; n != 0 {
				// The leaked transaction holds locks the cleanup needs.
				terminate(t, openMonitor(t), pid)
				t.Fatalf("%d connections in use after the panic", n)
			}
			if n := claims(t, db, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
				t.Errorf("%d claims after the panic, want 0", n)
			}
			if b := l.balance(t, 13); b != 0 {
				t.Errorf("balance %d after the panic, want 0", b)
			}
			if got, err := l.handle(context.Background(), msg); err != nil || got != idempotent.Applied {
				t.Fatalf("redelivery: (%v, %v), want applied", got, err)
			}
		})
	}
}

// A duplicate that waits behind an in-flight claim longer than the lock
// timeout gets ErrClaimBusy; when the holder commits, the message has been
// applied once and the next delivery is a duplicate.
func TestLockTimeoutClaimBusy(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 4)
	l := newLoyalty(t, db)
	busy, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithTable(l.schema+".processed_messages"), idempotent.WithLockTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	msg := orderCompleted{OrderID: 8, CustomerID: 8, TotalCents: 800}
	claimed, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(released) }) }
	// Should the timeout not work, the holder lets go after a while so
	// the test fails instead of hanging.
	safety := time.AfterFunc(10*time.Second, release)
	defer safety.Stop()
	holder := make(chan error, 1)
	go func() {
		_, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
			close(claimed)
			<-released
			return l.credit(ctx, tx, msg)
		})
		holder <- err
	}()
	<-claimed
	ran := false
	credit := func(ctx context.Context, tx *sql.Tx) error { ran = true; return l.credit(ctx, tx, msg) }
	_, err = busy.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, credit)
	release()
	if !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("waiting duplicate: %v, want ErrClaimBusy", err)
	}
	if sqlState(err) != "55P03" {
		t.Errorf("ErrClaimBusy does not wrap the 55P03 cause: %v", err)
	}
	if ran {
		t.Error("the busy duplicate ran the handler")
	}
	if err := <-holder; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if got, err := busy.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, credit); err != nil || got != idempotent.Duplicate {
		t.Fatalf("redelivery after the holder committed: (%v, %v), want duplicate", got, err)
	}
	if b := l.balance(t, 8); b != pointsFor(msg) {
		t.Errorf("balance %d, want %d", b, pointsFor(msg))
	}
	// Without a competing holder, the lock timeout changes nothing.
	if got, err := busy.ProcessMessage(context.Background(), idempotent.Message{Key: "free"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || got != idempotent.Applied {
		t.Fatalf("uncontended claim with a lock timeout: (%v, %v)", got, err)
	}
}

// Two consumers share one claim table; each applies the same key once.
func TestConsumersShareTable(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 4)
	l := newLoyalty(t, db)
	table := l.schema + ".processed_messages"
	analytics, err := idempotent.New(db, postgres.New(), "analytics", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	q := pq.QuoteIdentifier(l.schema)
	if _, err := db.Exec("CREATE TABLE " + q + ".order_stats (order_id bigint PRIMARY KEY, seen int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	record := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".order_stats VALUES ($1, 1) ON CONFLICT (order_id) DO UPDATE SET seen = order_stats.seen + 1", msg.OrderID)
		return err
	}
	for i := range 2 {
		want := idempotent.Applied
		if i > 0 {
			want = idempotent.Duplicate
		}
		if got, err := l.handle(context.Background(), msg); err != nil || got != want {
			t.Fatalf("loyalty delivery %d: (%v, %v), want %v", i+1, got, err, want)
		}
		if got, err := analytics.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, record); err != nil || got != want {
			t.Fatalf("analytics delivery %d: (%v, %v), want %v", i+1, got, err, want)
		}
	}
	if b := l.balance(t, 7); b != pointsFor(msg) {
		t.Errorf("balance %d, want %d", b, pointsFor(msg))
	}
	if n := count(t, db, "SELECT seen FROM "+q+".order_stats WHERE order_id = 9912"); n != 1 {
		t.Errorf("analytics saw the order %d times, want 1", n)
	}
	for _, c := range []string{"loyalty", "analytics"} {
		if n := claims(t, db, table, c, msg.key()); n != 1 {
			t.Errorf("%d claims for %s, want 1", n, c)
		}
	}
}

func TestEnsureSchemaTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	const n = 8
	db := openGuarded(t, "pq", n)
	schema := tempSchema(t, db)
	table := schema + ".claims"
	var wg sync.WaitGroup
	errs := make([]error, n)
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mw, err := idempotent.New(db, postgres.New(), fmt.Sprintf("c%d", i), idempotent.WithTable(table))
			if err != nil {
				errs[i] = err
				return
			}
			<-gate
			errs[i] = mw.EnsureSchema(context.Background())
		}()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent EnsureSchema %d: %v", i, err)
		}
	}
	mw, err := idempotent.New(db, postgres.New(), "c0", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatalf("EnsureSchema again: %v", err)
		}
	}
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || got != idempotent.Applied {
		t.Fatalf("Process on the ensured table: (%v, %v)", got, err)
	}
	if n := count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'claims'", schema); n != 2 {
		t.Errorf("%d indexes on the claim table, want 2 (primary key and processed_at)", n)
	}
	if n := count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'claims' AND indexdef LIKE '%(processed_at)'", schema); n != 1 {
		t.Errorf("%d processed_at indexes, want 1", n)
	}
}

// A table name at the identifier limit still gets its processed_at index,
// and two long names that share a prefix get one each.
func TestEnsureSchemaLongTableNames(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	schema := tempSchema(t, db)
	long := strings.Repeat("a", 60)
	for _, name := range []string{long + "bcd", long + "bce", strings.Repeat("z", 63)} {
		mw, err := idempotent.New(db, postgres.New(), "c", idempotent.WithTable(schema+"."+name))
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 AND indexdef LIKE '%(processed_at)'", schema, name); n != 1 {
			t.Errorf("table %s has %d processed_at indexes, want 1", name, n)
		}
	}
}

// Cancelling the context while the handler runs rolls everything back and
// returns an error matching context.Canceled; the handler is not re-run.
func TestContextCanceledMidHandler(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, during := range []string{"statement", "between statements"} {
			t.Run(drv+"/"+during, func(t *testing.T) {
				t.Parallel()
				db := openGuarded(t, drv, 3)
				mon := openMonitor(t)
				l := newLoyalty(t, db)
				msg := orderCompleted{OrderID: 21, CustomerID: 21, TotalCents: 2100}
				// A session lock held by the test: the handler blocks on it.
				lockConn, err := mon.Conn(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				lockKey := time.Now().UnixNano()
				if _, err := lockConn.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", lockKey); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_, _ = lockConn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", lockKey)
					_ = lockConn.Close()
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				pids := make(chan int, 1)
				proceed := make(chan struct{})
				calls := 0
				done := make(chan error, 1)
				go func() {
					_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
						calls++
						if err := l.credit(ctx, tx, msg); err != nil {
							return err
						}
						pid, err := backendPID(ctx, tx)
						if err != nil {
							return err
						}
						pids <- pid
						if during == "statement" {
							_, err = tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey)
							return err
						}
						<-proceed
						_, err = tx.ExecContext(ctx, "UPDATE "+pq.QuoteIdentifier(l.schema)+".balances SET points = points + 1000 WHERE customer_id = 21")
						return err
					})
					done <- err
				}()
				pid := <-pids
				if during == "statement" {
					waitPIDWaiting(t, mon, pid)
				}
				cancel()
				close(proceed)
				err = <-done
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Process after cancel: %v, want an error matching context.Canceled", err)
				}
				if calls != 1 {
					t.Errorf("handler ran %d times, want 1", calls)
				}
				if n := claims(t, mon, l.schema+".processed_messages", "loyalty", msg.key()); n != 0 {
					t.Errorf("%d claims after cancel, want 0", n)
				}
				if b := l.balance(t, 21); b != 0 {
					t.Errorf("balance %d after cancel, want 0", b)
				}
				// On cancellation database/sql rolls back from its own
				// goroutine, which may finish just after Process returns.
				waitFor(t, "connections to return to the pool", func() (bool, error) { return db.Stats().InUse == 0, nil })
			})
		}
	}
}

// Claim on a transaction the caller owns.
func TestClaimOnCallerTransaction(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 3)
	l := newLoyalty(t, db)
	msg := orderCompleted{OrderID: 31, CustomerID: 31, TotalCents: 3100}
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: msg.key()})
		if err != nil || claimed != want {
			_ = tx.Rollback()
			t.Fatalf("Claim %d: (%v, %v), want %v", i+1, claimed, err, want)
		}
		if claimed {
			if err := l.credit(ctx, tx, msg); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if b := l.balance(t, 31); b != pointsFor(msg) {
		t.Errorf("balance %d, want %d", b, pointsFor(msg))
	}
	// A rolled-back claim leaves nothing behind.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "rolled-back"}); err != nil || !claimed {
		t.Fatalf("Claim: (%v, %v)", claimed, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := claims(t, db, l.schema+".processed_messages", "loyalty", "rolled-back"); n != 0 {
		t.Errorf("%d claims after rollback, want 0", n)
	}
	if _, err := l.mw.ClaimMessage(ctx, nil, idempotent.Message{Key: "k"}); err == nil {
		t.Error("Claim with a nil transaction succeeded")
	}
}

// Claim on a caller-owned transaction, behind an in-flight holder, with a
// lock timeout: ErrClaimBusy, and the caller's transaction is left to the
// caller.
func TestClaimBusyOnCallerTransaction(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 3)
	l := newLoyalty(t, db)
	busy, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithTable(l.schema+".processed_messages"), idempotent.WithLockTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if ok, err := l.mw.ClaimMessage(ctx, holder, idempotent.Message{Key: "k"}); err != nil || !ok {
		t.Fatalf("holder Claim: (%v, %v)", ok, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	_, err = busy.ClaimMessage(ctx, tx, idempotent.Message{Key: "k"})
	if !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("Claim behind a holder: %v, want ErrClaimBusy", err)
	}
}

func TestMissingClaimTable(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	schema := tempSchema(t, db)
	var counts idempotent.Counts
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".nowhere"), idempotent.WithObserver(&counts))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, idempotent.ErrNoClaimTable) || sqlState(err) != "42P01" {
		t.Fatalf("Process without a claim table: %v, want ErrNoClaimTable wrapping 42P01", err)
	}
	if ran || counts.Retries() != 0 {
		t.Errorf("handler ran: %v, retries: %d; want neither", ran, counts.Retries())
	}
}

// The observer hears every outcome with its attempts, and every retry.
func TestObserverEvents(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	rec := &recorder{}
	l := newLoyalty(t, db, idempotent.WithObserver(rec), idempotent.WithRetry(fastRetry(5)))
	ctx := context.Background()
	attempt := 0
	flaky := func(ctx context.Context, tx *sql.Tx) error {
		attempt++
		if attempt == 1 {
			return raise(ctx, tx, "40001")
		}
		return nil
	}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "a"}, flaky); err != nil || got != idempotent.Applied {
		t.Fatalf("(%v, %v)", got, err)
	}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "a"}, flaky); err != nil || got != idempotent.Duplicate {
		t.Fatalf("(%v, %v)", got, err)
	}
	errFail := errors.New("fail")
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "b"}, func(context.Context, *sql.Tx) error { return errFail }); !errors.Is(err, errFail) {
		t.Fatal(err)
	}
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: ""}, flaky); !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	type brief struct {
		key      string
		outcome  idempotent.Outcome
		attempts int
		failed   bool
	}
	var got []brief
	for _, e := range rec.outcomes {
		if e.Consumer != "loyalty" || e.Duration <= 0 {
			t.Errorf("event %+v: want consumer loyalty and a duration", e)
		}
		got = append(got, brief{e.Key, e.Outcome, e.Attempts, e.Err != nil})
	}
	want := []brief{{"a", idempotent.Applied, 2, false}, {"a", idempotent.Duplicate, 1, false}, {"b", 0, 1, true}, {"", 0, 0, true}}
	if !slices.Equal(got, want) {
		t.Errorf("outcomes %+v, want %+v", got, want)
	}
	if len(rec.retries) != 1 {
		t.Fatalf("retries %+v, want 1", rec.retries)
	}
	r := rec.retries[0]
	if r.Key != "a" || r.Attempt != 1 || r.Code != "40001" || r.Reason != "serialization" || r.Err == nil || r.Backoff < 0 || r.Backoff > 4*time.Millisecond {
		t.Errorf("retry event %+v", r)
	}
}

// WrapMessage decodes nothing itself: it reads the message's Message, then
// processes it.
func TestWrapMessage(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pgx", 2)
	l := newLoyalty(t, db)
	handle := idempotent.WrapMessage(l.mw, orderMsg, l.credit)
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if got, err := handle(context.Background(), msg); err != nil || got != want {
			t.Fatalf("(%v, %v), want %v", got, err, want)
		}
	}
	if b := l.balance(t, 7); b != pointsFor(msg) {
		t.Errorf("balance %d, want %d", b, pointsFor(msg))
	}
}

// RunTx retries a retryable failure and commits once.
func TestRunTx(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	schema := tempSchema(t, db)
	q := pq.QuoteIdentifier(schema)
	if _, err := db.Exec("CREATE TABLE " + q + ".ledger (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	attempt := 0
	err := idempotent.RunTx(context.Background(), db, postgres.New(), nil, fastRetry(3), func(ctx context.Context, tx *sql.Tx) error {
		attempt++
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+q+".ledger VALUES (1)"); err != nil {
			return err
		}
		if attempt == 1 {
			return raise(ctx, tx, "40P01")
		}
		return nil
	})
	if err != nil || attempt != 2 {
		t.Fatalf("RunTx: %v after %d attempts, want success after 2", err, attempt)
	}
	if n := count(t, db, "SELECT count(*) FROM "+q+".ledger"); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
	err = idempotent.RunTx(context.Background(), db, postgres.New(), nil, fastRetry(2), func(ctx context.Context, tx *sql.Tx) error {
		return raise(ctx, tx, "40001")
	})
	if !errors.Is(err, idempotent.ErrRetriesExhausted) || sqlState(err) != "40001" {
		t.Errorf("RunTx that always fails: %v, want ErrRetriesExhausted wrapping 40001", err)
	}
	// No backoff at all is allowed: retry at once.
	attempt = 0
	err = idempotent.RunTx(context.Background(), db, postgres.New(), &sql.TxOptions{Isolation: sql.LevelSerializable}, idempotent.RetryPolicy{MaxAttempts: 3}, func(ctx context.Context, tx *sql.Tx) error {
		if attempt++; attempt < 3 {
			return raise(ctx, tx, "40001")
		}
		return nil
	})
	if err != nil || attempt != 3 {
		t.Errorf("RunTx without backoff: %v after %d attempts, want success after 3", err, attempt)
	}
	if err := idempotent.RunTx(context.Background(), db, postgres.New(), nil, idempotent.RetryPolicy{}, func(context.Context, *sql.Tx) error { return nil }); err == nil {
		t.Error("RunTx with a zero policy succeeded")
	}
}

// cancelOnRetry is an Observer that checks no connection is held when a
// retry is announced (the backoff sleep runs with no transaction open), and
// then cancels the delivery's context.
type cancelOnRetry struct {
	db     *sql.DB
	cancel context.CancelFunc
	inUse  atomic.Int32
}

func (c *cancelOnRetry) Outcome(context.Context, idempotent.Event) {}

func (c *cancelOnRetry) Retry(context.Context, idempotent.RetryEvent) {
	c.inUse.Store(int32(c.db.Stats().InUse))
	c.cancel()
}

// The backoff between attempts is slept with no transaction open, and a
// context ended during it stops the retries at once.
func TestRetryBackoffHonoursContext(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := &cancelOnRetry{db: db, cancel: cancel}
	obs.inUse.Store(-1)
	l := newLoyalty(t, db, idempotent.WithObserver(obs),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
	calls := 0
	done := make(chan error, 1)
	go func() {
		_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error {
			calls++
			return raise(ctx, tx, "40001")
		})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		// The backoff is an hour: only a sleep that ignores ctx gets here.
		t.Fatal("Process did not return after its context was cancelled during the backoff")
	}
	if !errors.Is(err, context.Canceled) || sqlState(err) != "40001" {
		t.Errorf("Process cancelled in its backoff: %v, want context.Canceled joined with the 40001", err)
	}
	if calls != 1 {
		t.Errorf("handler ran %d times, want 1", calls)
	}
	if n := obs.inUse.Load(); n != 0 {
		t.Errorf("%d connections in use during the backoff, want 0", n)
	}
}

// A context that has already ended opens no transaction.
func TestContextAlreadyCanceled(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	l := newLoyalty(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, context.Canceled) || ran {
		t.Errorf("Process with a cancelled context: %v (handler ran: %v), want context.Canceled", err, ran)
	}
	if n := claims(t, db, l.schema+".processed_messages", "loyalty", "k"); n != 0 {
		t.Errorf("%d claims, want 0", n)
	}
}
