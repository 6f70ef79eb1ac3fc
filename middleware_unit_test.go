package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// Unit tests of Middleware.Process, Wrap, Claim and EnsureSchema on
// go-sqlmock: one per way a delivery can go, each asserting the exact driver
// calls and what the caller gets back.

func TestProcessApplied(t *testing.T) {
	r := newRecorded(t)
	ev := &events{}
	mw := newMiddleware(t, r, idempotent.WithObserver(ev))
	expectApplied(r.mock, key)

	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	if e := ev.only(t); e.Consumer != consumer || e.Key != key || e.Outcome != idempotent.Applied || e.Attempts != 1 || e.Err != nil || e.Duration <= 0 {
		t.Fatalf("event %+v", e)
	}
}

func TestProcessDuplicateRollsBack(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r)
	r.mock.ExpectBegin()
	expectClaim(r.mock, key, 0)
	r.mock.ExpectRollback()

	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
		t.Error("the handler ran for a duplicate")
		return nil
	})
	if err != nil || got != idempotent.Duplicate {
		t.Fatalf("got (%v, %v), want duplicate", got, err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
}

func TestBeginFails(t *testing.T) {
	t.Run("not retryable", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		tooMany := &pq.Error{Code: "53300"}
		r.mock.ExpectBegin().WillReturnError(tooMany)

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, tooMany) || !strings.Contains(err.Error(), "begin") {
			t.Fatalf("got (%v, %v), want the begin error", got, err)
		}
		r.wantCalls(t, "BEGIN")
		if e := ev.only(t); e.Attempts != 1 || !errors.Is(e.Err, tooMany) || e.Outcome != 0 {
			t.Fatalf("event %+v", e)
		}
	})
	t.Run("retryable", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin().WillReturnError(&pq.Error{Code: "57P03"}) // cannot_connect_now
		expectApplied(r.mock, key)

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
}

func TestClaimFails(t *testing.T) {
	cases := []struct {
		name string
		err  error
		opts []idempotent.Option
		// lock is the lock timeout statement, when the case sets one.
		lock string
		is   error
	}{
		{name: "not null violation", err: &pq.Error{Code: "23502"}},
		{name: "undefined table", err: &pq.Error{Code: "42P01"}, is: idempotent.ErrNoClaimTable},
		{name: "lock timeout", err: &pq.Error{Code: "55P03"}, opts: []idempotent.Option{idempotent.WithLockTimeout(250 * time.Millisecond)},
			lock: "SET LOCAL lock_timeout = 250", is: idempotent.ErrClaimBusy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMiddleware(t, r, c.opts...)
			r.mock.ExpectBegin()
			want := []string{"BEGIN"}
			if c.lock != "" {
				r.mock.ExpectExec(c.lock).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
				want = append(want, c.lock)
			}
			expectClaimError(r.mock, key, c.err)
			r.mock.ExpectRollback()

			got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
				t.Error("the handler ran after a failed claim")
				return nil
			})
			if got != 0 || !errors.Is(err, c.err) || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("got (%v, %v), want an error matching %v and %v", got, err, c.err, c.is)
			}
			if !strings.Contains(err.Error(), `consumer "loyalty", key "order-completed:9912"`) {
				t.Fatalf("error %q does not name consumer and key", err)
			}
			r.wantCalls(t, append(want, claimSQL, "ROLLBACK")...)
		})
	}
}

func TestClaimFailsRetryable(t *testing.T) {
	cases := []struct {
		name, reason, code string
		err                error
	}{
		{"serialization failure", "serialization", "40001", &pq.Error{Code: "40001"}},
		{"deadlock", "serialization", "40P01", &pq.Error{Code: "40P01"}},
		{"admin shutdown", "connection", "57P01", &pq.Error{Code: "57P01"}},
		{"bad connection", "connection", "", driver.ErrBadConn},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			ev := &events{}
			mw := newMiddleware(t, r, idempotent.WithObserver(ev))
			r.mock.ExpectBegin()
			expectClaimError(r.mock, key, c.err)
			r.mock.ExpectRollback()
			expectApplied(r.mock, key)

			if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
				t.Fatalf("got (%v, %v), want applied", got, err)
			}
			r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK", "BEGIN", claimSQL, effectSQL, "COMMIT")
			if len(ev.retries) != 1 {
				t.Fatalf("retry events %+v, want 1", ev.retries)
			}
			re := ev.retries[0]
			if re.Attempt != 1 || re.Reason != c.reason || re.Code != c.code || !errors.Is(re.Err, c.err) || re.Key != key || re.Consumer != consumer || re.Backoff != 0 {
				t.Fatalf("retry event %+v", re)
			}
			if e := ev.only(t); e.Attempts != 2 || e.Outcome != idempotent.Applied {
				t.Fatalf("event %+v", e)
			}
		})
	}
}

func TestLockTimeoutStatementFails(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r, idempotent.WithLockTimeout(time.Second))
	bad := &pq.Error{Code: "42601"}
	r.mock.ExpectBegin()
	r.mock.ExpectExec("SET LOCAL lock_timeout = 1000").WillReturnError(bad)
	r.mock.ExpectRollback()

	_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
	if !errors.Is(err, bad) || !strings.Contains(err.Error(), "set lock timeout") {
		t.Fatalf("got %v, want the lock timeout statement's error", err)
	}
	r.wantCalls(t, "BEGIN", "SET LOCAL lock_timeout = 1000", "ROLLBACK")
}

func TestClaimRowsAffectedFails(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r)
	unknown := errors.New("rows affected not supported")
	r.mock.ExpectBegin()
	r.mock.ExpectExec(claimSQL).WithArgs(consumer, key).WillReturnResult(sqlmock.NewErrorResult(unknown))
	r.mock.ExpectRollback()

	_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
	if !errors.Is(err, unknown) || !strings.Contains(err.Error(), "rows affected") {
		t.Fatalf("got %v, want the RowsAffected error", err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
}

// TestClaimRowFails: the horizon claim's answer (its count and horizon)
// cannot be read, so the delivery fails with the error and rolls back.
func TestClaimRowFails(t *testing.T) {
	r := newRecorded(t)
	mw := newMessageMiddleware(t, r)
	unknown := errors.New("row lost in transit")
	r.mock.ExpectBegin()
	r.mock.ExpectExec(horizonClaimSQL).WithArgs(consumer, key, msgNow.Add(-idempotent.DefaultClockSkew).UTC()).WillReturnResult(sqlmock.NewErrorResult(unknown))
	r.mock.ExpectRollback()

	_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: msgNow}, func(context.Context, *sql.Tx) error {
		t.Error("the handler ran after an unread claim")
		return nil
	})
	if !errors.Is(err, unknown) || !strings.Contains(err.Error(), "rows affected") {
		t.Fatalf("got %v, want the RowsAffected error", err)
	}
	r.wantCalls(t, "BEGIN", horizonClaimSQL, "ROLLBACK")
}

func TestHandlerError(t *testing.T) {
	t.Run("returned, rolled back, not retried", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		failed := errors.New("customer 7 is closed")
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectRollback()

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { return failed })
		if got != 0 || !errors.Is(err, failed) {
			t.Fatalf("got (%v, %v), want the handler's error", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("effect statement fails", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		check := &pq.Error{Code: "23514"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectExec(effectSQL).WillReturnError(check)
		r.mock.ExpectRollback()

		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); !errors.Is(err, check) {
			t.Fatalf("got %v, want the effect's error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "ROLLBACK")
	})
	// A handler's error that the dialect classifies as retryable is retried
	// only when the transaction suffered it: the probe tells.
	for _, c := range []struct {
		name    string
		failure error
		probe   error // what SAVEPOINT meets; nil: the transaction is alive
		retried bool
	}{
		{"deadlock of the transaction, wrapped by the handler", fmt.Errorf("credit: %w", &pq.Error{Code: "40P01"}), aborted, true},
		{"serialization failure met elsewhere", fmt.Errorf("audit database: %w", &pq.Error{Code: "40001"}), nil, false},
		{"connection lost", fmt.Errorf("credit: %w", driver.ErrBadConn), driver.ErrBadConn, true},
		{"serialization failure, connection lost", &pq.Error{Code: "40001"}, io.ErrUnexpectedEOF, true},
		{"handler's EOF, connection alive", fmt.Errorf("points service: %w", io.EOF), nil, false},
		{"handler's EOF, transaction aborted", io.EOF, aborted, false},
		{"handler's network error", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			var ev events
			mw := newMiddleware(t, r, idempotent.WithObserver(&ev))
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			expectProbe(r.mock, c.probe)
			r.mock.ExpectRollback()
			want := []string{"BEGIN", claimSQL, dialect.ProbeSavepointSQL}
			if c.probe == nil {
				want = append(want, dialect.ProbeReleaseSQL)
			}
			want = append(want, "ROLLBACK")
			if c.retried {
				expectApplied(r.mock, key)
				want = append(want, "BEGIN", claimSQL, effectSQL, "COMMIT")
			}

			calls := 0
			got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
				if calls++; calls == 1 {
					return c.failure
				}
				return effect(ctx, tx)
			})
			switch {
			case c.retried && (err != nil || got != idempotent.Applied || calls != 2 || len(ev.retries) != 1):
				t.Fatalf("got (%v, %v) after %d calls and %d retries, want applied after one retry", got, err, calls, len(ev.retries))
			case !c.retried && (!errors.Is(err, c.failure) || errors.Is(err, idempotent.ErrRetriesExhausted) || calls != 1 || len(ev.retries) != 0):
				t.Fatalf("got (%v, %v) after %d calls and %d retries, want the handler's error at once", got, err, calls, len(ev.retries))
			}
			r.wantCalls(t, want...)
		})
	}
	// A context error is never retried, nor is the transaction probed for
	// it: pgx reports a query's own deadline as a connection failure.
	t.Run("handler's own deadline", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectRollback()
		deadline := &safeToRetry{context.DeadlineExceeded}
		calls := 0
		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { calls++; return deadline })
		if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
			t.Fatalf("got %v after %d calls, want the deadline at once", err, calls)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	// The claim's own failures are the transaction's: retried unprobed.
	t.Run("claim's serialization failure", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaimError(r.mock, key, &pq.Error{Code: "40001"})
		r.mock.ExpectRollback()
		expectApplied(r.mock, key)
		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK", "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
}

// safeToRetry is pgx's shape of a client-side failure: it has a
// SafeToRetry method, which the Postgres dialect classifies as a lost
// connection.
type safeToRetry struct{ err error }

func (e *safeToRetry) Error() string     { return "timeout: " + e.err.Error() }
func (e *safeToRetry) Unwrap() error     { return e.err }
func (e *safeToRetry) SafeToRetry() bool { return false }

// A transaction begun inside a handler with the handler's context is refused
// before it reaches the driver, and the handler's transaction rolls back
// even when the handler swallows the refusal.
func TestNestedTransactionRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(ctx context.Context, mw *idempotent.Middleware, db *sql.DB) error
	}{
		{"RunTx", func(ctx context.Context, _ *idempotent.Middleware, db *sql.DB) error {
			return idempotent.RunTx(ctx, db, pg, nil, idempotent.DefaultRetryPolicy(), effect)
		}},
		{"Process, same key", func(ctx context.Context, mw *idempotent.Middleware, _ *sql.DB) error {
			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
			return err
		}},
		{"ProcessBatch", func(ctx context.Context, mw *idempotent.Middleware, _ *sql.DB) error {
			_, err := mw.ProcessMessages(ctx, keyMessages("other"), func(context.Context, *sql.Tx, []int) error { return nil })
			return err
		}},
		{"ProcessNatural", func(ctx context.Context, mw *idempotent.Middleware, _ *sql.DB) error {
			_, err := mw.ProcessNatural(ctx, idempotent.Message{Key: "other"}, func(context.Context, *sql.Tx) (bool, error) { return true, nil })
			return err
		}},
		{"EnsureSchema", func(ctx context.Context, mw *idempotent.Middleware, _ *sql.DB) error {
			return mw.EnsureSchema(ctx)
		}},
		{"Cleanup", func(ctx context.Context, mw *idempotent.Middleware, _ *sql.DB) error {
			_, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, idempotent.DefaultCleanupOptions())
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMiddleware(t, r)
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			r.mock.ExpectRollback()
			var nested error
			_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, _ *sql.Tx) error {
				nested = c.run(ctx, mw, r.db)
				return nil
			})
			if !errors.Is(nested, idempotent.ErrAutocommit) || !strings.Contains(nested.Error(), "inside a handler") {
				t.Errorf("nested call: %v, want ErrAutocommit saying a transaction was begun inside a handler", nested)
			}
			if !errors.Is(err, idempotent.ErrAutocommit) {
				t.Errorf("Process: %v, want ErrAutocommit", err)
			}
			r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
		})
	}
}

func TestHandlerPanics(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r)
	r.mock.ExpectBegin()
	expectClaim(r.mock, key, 1)
	r.mock.ExpectRollback()
	expectApplied(r.mock, "next")

	type boom struct{}
	func() {
		defer func() {
			if p := recover(); p != (boom{}) {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		_, _ = mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { panic(boom{}) })
		t.Fatal("Process returned after the handler panicked")
	}()
	// The connection went back to the pool: the next delivery runs.
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "next"}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("next delivery: got (%v, %v)", got, err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK", "BEGIN", claimSQL, effectSQL, "COMMIT")
}

func TestCommitFails(t *testing.T) {
	t.Run("serialization failure is retried", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit().WillReturnError(&pq.Error{Code: "40001"})
		expectApplied(r.mock, key)

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT", "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	for _, lost := range []error{driver.ErrBadConn, &pq.Error{Code: "57P01"}} {
		t.Run("lost connection is retried/"+lost.Error(), func(t *testing.T) {
			r := newRecorded(t)
			mw := newMiddleware(t, r)
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			expectEffect(r.mock)
			r.mock.ExpectCommit().WillReturnError(lost)
			// The commit had landed: the retry finds the claim.
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 0)
			r.mock.ExpectRollback()

			if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
				t.Fatalf("got (%v, %v), want duplicate", got, err)
			}
			r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT", "BEGIN", claimSQL, "ROLLBACK")
		})
	}
	t.Run("other error is returned without rollback", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		deferred := &pq.Error{Code: "23505", Constraint: "one_credit_per_order"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit().WillReturnError(deferred)

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, deferred) || !strings.Contains(err.Error(), "commit") || errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got (%v, %v), want the commit error alone", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
}

func TestRollbackFails(t *testing.T) {
	t.Run("after a handler error both are returned", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		failed := errors.New("customer 7 is closed")
		rbErr := errors.New("rollback: broken pipe")
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectRollback().WillReturnError(rbErr)

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { return failed })
		if got != 0 || !errors.Is(err, failed) || !errors.Is(err, rbErr) {
			t.Fatalf("got (%v, %v), want the handler's error joined with the rollback's", got, err)
		}
		if !strings.Contains(err.Error(), "rollback after failure") {
			t.Fatalf("error %q does not say the rollback failed", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("after a lost connection the attempt is retried", func(t *testing.T) {
		// The transaction died with the connection; its rollback failing
		// says nothing new.
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaimError(r.mock, key, &pq.Error{Code: "57P01"})
		r.mock.ExpectRollback().WillReturnError(driver.ErrBadConn)
		expectApplied(r.mock, key)

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK", "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("after a duplicate", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		rbErr := &pq.Error{Code: "XX000"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback().WillReturnError(rbErr)

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, rbErr) || !strings.Contains(err.Error(), "rollback") {
			t.Fatalf("got (%v, %v), want the rollback error", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("after a duplicate, retryable", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback().WillReturnError(&pq.Error{Code: "57P01"})
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback()

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
			t.Fatalf("got (%v, %v), want duplicate", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK", "BEGIN", claimSQL, "ROLLBACK")
	})
}

// TestHandlerEndsTransaction covers a handler that commits or rolls back the
// claim's transaction itself: the delivery fails with ErrAutocommit.
func TestHandlerEndsTransaction(t *testing.T) {
	cases := []struct {
		name  string
		fn    func(context.Context, *sql.Tx) error
		end   string // the handler's own call
		other error  // an error the handler returns besides
	}{
		{"commits", func(_ context.Context, tx *sql.Tx) error { return tx.Commit() }, "COMMIT", nil},
		{"rolls back", func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }, "ROLLBACK", nil},
		{"rolls back and fails", func(_ context.Context, tx *sql.Tx) error {
			_ = tx.Rollback()
			return errHandler
		}, "ROLLBACK", errHandler},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMiddleware(t, r)
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			if c.end == "COMMIT" {
				r.mock.ExpectCommit()
			} else {
				r.mock.ExpectRollback()
			}

			got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, c.fn)
			if got != 0 || !errors.Is(err, idempotent.ErrAutocommit) || (c.other != nil && !errors.Is(err, c.other)) {
				t.Fatalf("got (%v, %v), want ErrAutocommit (and %v)", got, err, c.other)
			}
			r.wantCalls(t, "BEGIN", claimSQL, c.end)
		})
	}
}

var errHandler = errors.New("handler failed")

func TestStrictGuard(t *testing.T) {
	txid := func(id string) *sqlmock.Rows { return sqlmock.NewRows([]string{"txid"}).AddRow(id) }
	t.Run("applied", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		r.mock.ExpectCommit()

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "COMMIT")
	})
	t.Run("duplicate reads no id", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback()

		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
			t.Fatalf("got (%v, %v), want duplicate", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("id changed", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("732"))
		r.mock.ExpectRollback()

		got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, idempotent.ErrAutocommit) || !strings.Contains(err.Error(), "id 731, now 732") {
			t.Fatalf("got (%v, %v), want ErrAutocommit naming both ids", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "ROLLBACK")
	})
	t.Run("first read fails", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		bad := &pq.Error{Code: "42883"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnError(bad)
		r.mock.ExpectRollback()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
			t.Error("the handler ran without a transaction id")
			return nil
		})
		if !errors.Is(err, bad) || !strings.Contains(err.Error(), "strict guard") {
			t.Fatalf("got %v, want the strict guard's read error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, "ROLLBACK")
	})
	t.Run("second read fails", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		bad := &pq.Error{Code: "XX000"}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		expectEffect(r.mock)
		r.mock.ExpectQuery(txidSQL).WillReturnError(bad)
		r.mock.ExpectRollback()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
		if !errors.Is(err, bad) || errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got %v, want the strict guard's read error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, effectSQL, txidSQL, "ROLLBACK")
	})
	t.Run("handler committed", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithStrictGuard())
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectQuery(txidSQL).WillReturnRows(txid("731"))
		r.mock.ExpectCommit()

		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(_ context.Context, tx *sql.Tx) error { return tx.Commit() })
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("got %v, want ErrAutocommit", err)
		}
		if n := strings.Count(err.Error(), "committed or rolled back the transaction itself"); n != 1 {
			t.Fatalf("error %q says it %d times, want once", err, n)
		}
		r.wantCalls(t, "BEGIN", claimSQL, txidSQL, "COMMIT")
	})
}

// TestContextEnds covers a context that ends during a delivery.
func TestContextEnds(t *testing.T) {
	t.Run("before the delivery: nothing sent", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, context.Canceled) {
			t.Fatalf("got (%v, %v), want context.Canceled", got, err)
		}
		r.wantCalls(t)
	})
	t.Run("during the handler: not retried", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		ctx := newFlagCtx()
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		r.mock.ExpectRollback()

		lost := &pq.Error{Code: "40001"}
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
			ctx.end()
			return lost
		})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, lost) {
			t.Fatalf("got %v, want context.Canceled joined with the handler's error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("during a duplicate's rollback", func(t *testing.T) {
		// The claim exists: a rollback failing because the context ended
		// loses nothing, and the duplicate is reported.
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		ctx := newFlagCtx()
		r.onCall = func(call string) {
			if call == "ROLLBACK" {
				ctx.end()
			}
		}
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback().WillReturnError(sqlmock.ErrCancelled)

		if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
			t.Fatalf("got (%v, %v), want duplicate", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("after the handler ended the transaction", func(t *testing.T) {
		// With the context gone, database/sql may have rolled the
		// transaction back itself: a transaction found ended is no
		// handler bug, and the context's error is what the caller sees.
		for _, handlerErr := range []error{nil, errHandler} {
			r := newRecorded(t)
			mw := newMiddleware(t, r)
			ctx := newFlagCtx()
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			r.mock.ExpectRollback()

			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(_ context.Context, tx *sql.Tx) error {
				_ = tx.Rollback()
				ctx.end()
				return handlerErr
			})
			if !errors.Is(err, context.Canceled) || errors.Is(err, idempotent.ErrAutocommit) || (handlerErr != nil && !errors.Is(err, handlerErr)) {
				t.Fatalf("handler error %v: got %v, want context.Canceled (and the handler's error), not ErrAutocommit", handlerErr, err)
			}
			r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
		}
	})
	t.Run("before a retry without backoff", func(t *testing.T) {
		r := newRecorded(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mw := newMiddleware(t, r, idempotent.WithObserver(&events{onRetry: func(idempotent.RetryEvent) { cancel() }}))
		serial := &pq.Error{Code: "40P01"}
		r.mock.ExpectBegin()
		expectClaimError(r.mock, key, serial)
		r.mock.ExpectRollback()

		if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); !errors.Is(err, context.Canceled) || !errors.Is(err, serial) {
			t.Fatalf("got %v, want context.Canceled joined with the attempt's error", err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
	})
	t.Run("during the backoff", func(t *testing.T) {
		r := newRecorded(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ev := &events{onRetry: func(idempotent.RetryEvent) { cancel() }}
		// An hour's backoff: the test only ends if the sleep stops with
		// the context.
		mw := newMiddleware(t, r, idempotent.WithObserver(ev),
			idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
		serial := &pq.Error{Code: "40001"}
		r.mock.ExpectBegin()
		expectClaimError(r.mock, key, serial)
		r.mock.ExpectRollback()

		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
		if got != 0 || !errors.Is(err, context.Canceled) || !errors.Is(err, serial) {
			t.Fatalf("got (%v, %v), want context.Canceled joined with the attempt's error", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
		if len(ev.retries) != 1 || ev.retries[0].Backoff < 30*time.Minute || ev.retries[0].Backoff > time.Hour {
			t.Fatalf("retry events %+v, want one with a backoff in [30m, 1h]", ev.retries)
		}
		if e := ev.only(t); e.Attempts != 1 {
			t.Fatalf("event %+v", e)
		}
	})
}

func TestWrapMessageKeyFunction(t *testing.T) {
	type order struct{ id int64 }
	keyOf := func(o order) (idempotent.Message, error) {
		if o.id == 0 {
			return idempotent.Message{}, errors.New("order has no id")
		}
		return idempotent.Message{Key: "order-completed:" + strconv.FormatInt(o.id, 10)}, nil
	}
	t.Run("applies", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		expectApplied(r.mock, key)
		var seen order
		handle := idempotent.WrapMessage(mw, keyOf, func(ctx context.Context, tx *sql.Tx, o order) error {
			seen = o
			return effect(ctx, tx)
		})
		if got, err := handle(context.Background(), order{id: 9912}); err != nil || got != idempotent.Applied || seen.id != 9912 {
			t.Fatalf("got (%v, %v), handler saw %+v", got, err, seen)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("key function fails: nothing sent", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		handle := idempotent.WrapMessage(mw, keyOf, func(context.Context, *sql.Tx, order) error {
			t.Error("the handler ran without a key")
			return nil
		})
		got, err := handle(context.Background(), order{})
		if got != 0 || !errors.Is(err, idempotent.ErrInvalidKey) || !strings.Contains(err.Error(), "order has no id") {
			t.Fatalf("got (%v, %v), want ErrInvalidKey with the key function's error", got, err)
		}
		r.wantCalls(t)
		if e := ev.only(t); e.Consumer != consumer || !errors.Is(e.Err, idempotent.ErrInvalidKey) || e.Attempts != 0 {
			t.Fatalf("event %+v", e)
		}
		// And without an observer.
		handle = idempotent.WrapMessage(newMiddleware(t, r), keyOf, func(context.Context, *sql.Tx, order) error { return nil })
		if _, err := handle(context.Background(), order{}); !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Fatalf("got %v, want ErrInvalidKey", err)
		}
		r.wantCalls(t)
	})
}

func TestInvalidKeys(t *testing.T) {
	long := strings.Repeat("k", 1025)
	for _, k := range []string{"", long, "order\x00", "order-\xff"} {
		t.Run(fmt.Sprintf("%.12q", k), func(t *testing.T) {
			r := newRecorded(t)
			ev := &events{}
			mw := newMiddleware(t, r, idempotent.WithObserver(ev))
			got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: k}, effect)
			if got != 0 || !errors.Is(err, idempotent.ErrInvalidKey) {
				t.Fatalf("Process: got (%v, %v), want ErrInvalidKey", got, err)
			}
			if e := ev.only(t); e.Attempts != 0 || !errors.Is(e.Err, idempotent.ErrInvalidKey) {
				t.Fatalf("event %+v", e)
			}
			r.mock.ExpectBegin()
			r.mock.ExpectRollback()
			tx, err := r.db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := mw.ClaimMessage(context.Background(), tx, idempotent.Message{Key: k}); !errors.Is(err, idempotent.ErrInvalidKey) {
				t.Fatalf("Claim: got %v, want ErrInvalidKey", err)
			}
			r.wantCalls(t, "BEGIN")
		})
	}
	t.Run("longest key", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		expectApplied(r.mock, long[:1024])
		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: long[:1024]}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
	})
	t.Run("nil function", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, nil); err == nil || !strings.Contains(err.Error(), "nil function") {
			t.Fatalf("got %v, want a nil function error", err)
		}
		r.wantCalls(t)
	})
}

func TestClaim(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r, idempotent.WithLockTimeout(time.Second))
	ctx := context.Background()
	if _, err := mw.ClaimMessage(ctx, nil, idempotent.Message{Key: key}); err == nil || !strings.Contains(err.Error(), "nil transaction") {
		t.Fatalf("nil tx: got %v", err)
	}
	lock := "SET LOCAL lock_timeout = 1000"
	failed := &pq.Error{Code: "XX000"}
	r.mock.ExpectBegin()
	r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
	expectClaim(r.mock, "new", 1)
	r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
	expectClaim(r.mock, "old", 0)
	r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
	expectClaimError(r.mock, "bad", failed)
	r.mock.ExpectCommit()

	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "new"}); !ok || err != nil {
		t.Fatalf("new: got (%v, %v)", ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "old"}); ok || err != nil {
		t.Fatalf("old: got (%v, %v)", ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "bad"}); ok || !errors.Is(err, failed) || !strings.Contains(err.Error(), `key "bad"`) {
		t.Fatalf("bad: got (%v, %v)", ok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r.wantCalls(t, "BEGIN", lock, claimSQL, lock, claimSQL, lock, claimSQL, "COMMIT")
}

// driverValues converts a dialect's statement arguments for WithArgs.
func driverValues(args []any) []driver.Value {
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a
	}
	return vals
}

// versionSQL is the Postgres dialect's server check.
const versionSQL = "SELECT version()"

func expectVersion(m sqlmock.Sqlmock, v string) {
	m.ExpectQuery(versionSQL).WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"version"}).AddRow(v))
}

// expectTableKind scripts the Postgres dialect's question, after the schema
// transaction, of whether the claim table exists and is partitioned.
func expectTableKind(m sqlmock.Sqlmock, t dialect.Table, exists, partitioned bool) string {
	q, args := pg.TableKindSQL(t)
	m.ExpectQuery(q).WithArgs(driverValues(args)...).WillReturnRows(sqlmock.NewRows([]string{"exists", "partitioned"}).AddRow(exists, partitioned))
	return q
}

func TestTxOptions(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r, idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
	expectApplied(r.mock, key)
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	r.wantCalls(t, "BEGIN Serializable", claimSQL, effectSQL, "COMMIT")
}

// resetDialect is the Postgres dialect with a lock timeout reset, as a
// dialect whose lock timeout outlives the transaction (MySQL's) has.
type resetDialect struct{ *postgres.Dialect }

const resetSQL = "SET lock_timeout = DEFAULT"

func (resetDialect) LockTimeoutResetSQL() string { return resetSQL }

// TestLockTimeoutReset checks the reset follows the claim whether the claim
// succeeded or not, and that a failed reset fails the delivery.
func TestLockTimeoutReset(t *testing.T) {
	const lock = "SET LOCAL lock_timeout = 1000"
	batchSQL := pg.BatchClaimSQL(dialect.Table{Name: idempotent.DefaultTable})
	newReset := func(t *testing.T, r *recorded) *idempotent.Middleware {
		t.Helper()
		mw, err := idempotent.New(r.db, resetDialect{pg}, consumer, noWait, idempotent.WithLockTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	t.Run("applied", func(t *testing.T) {
		r := newRecorded(t)
		mw := newReset(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
		expectClaim(r.mock, key, 1)
		r.mock.ExpectExec(resetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", lock, claimSQL, resetSQL, effectSQL, "COMMIT")
	})
	t.Run("claim busy", func(t *testing.T) {
		r := newRecorded(t)
		mw := newReset(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
		expectClaimError(r.mock, key, &pq.Error{Code: "55P03"})
		r.mock.ExpectExec(resetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		r.mock.ExpectRollback()
		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); !errors.Is(err, idempotent.ErrClaimBusy) {
			t.Fatalf("got %v, want ErrClaimBusy", err)
		}
		r.wantCalls(t, "BEGIN", lock, claimSQL, resetSQL, "ROLLBACK")
	})
	t.Run("reset fails", func(t *testing.T) {
		r := newRecorded(t)
		mw := newReset(t, r)
		bad := &pq.Error{Code: "XX000"}
		r.mock.ExpectBegin()
		r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
		expectClaim(r.mock, key, 1)
		r.mock.ExpectExec(resetSQL).WillReturnError(bad)
		r.mock.ExpectRollback()
		_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
			t.Error("the handler ran after a failed reset")
			return nil
		})
		if !errors.Is(err, bad) || !strings.Contains(err.Error(), "reset lock timeout") {
			t.Fatalf("got %v, want the reset's error", err)
		}
		r.wantCalls(t, "BEGIN", lock, claimSQL, resetSQL, "ROLLBACK")
	})
	// The batch claims through the same path: the reset follows its last
	// claim statement, before the handler, and after a failed one too.
	t.Run("batch applied", func(t *testing.T) {
		r := newRecorded(t)
		mw := newReset(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, sqlmock.AnyArg()).WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("a"))
		r.mock.ExpectExec(resetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		outs, err := mw.ProcessMessages(context.Background(), keyMessages("b", "a"), func(ctx context.Context, tx *sql.Tx, _ []int) error { return effect(ctx, tx) })
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Applied}) {
			t.Fatalf("got (%v, %v), want [duplicate applied]", outs, err)
		}
		r.wantCalls(t, "BEGIN", lock, batchSQL, resetSQL, effectSQL, "COMMIT")
	})
	t.Run("batch claim busy", func(t *testing.T) {
		r := newRecorded(t)
		mw := newReset(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectExec(lock).WillReturnResult(sqlmock.NewResult(0, 0))
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, sqlmock.AnyArg()).WillReturnError(&pq.Error{Code: "55P03"})
		r.mock.ExpectExec(resetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		r.mock.ExpectRollback()
		if _, err := mw.ProcessMessages(context.Background(), keyMessages("a"), func(context.Context, *sql.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrClaimBusy) {
			t.Fatalf("got %v, want ErrClaimBusy", err)
		}
		r.wantCalls(t, "BEGIN", lock, batchSQL, resetSQL, "ROLLBACK")
	})
}

// plainDialect hides every optional interface of the dialect it wraps.
type plainDialect struct{ dialect.Dialect }

// TestRetentionBranches covers the retention fence's branches in the
// middleware: a refused event time sends nothing, a partitioned claim needs
// an event time, and a claim for a day without partition is beyond
// retention.
func TestRetentionBranches(t *testing.T) {
	ctx := context.Background()
	t.Run("partitions need a partitioning dialect", func(t *testing.T) {
		db, _ := sqlmockDB(t)
		if _, err := idempotent.New(db, plainDialect{pg}, consumer, idempotent.WithDailyPartitions(2)); err == nil || !strings.Contains(err.Error(), "does not support partitions") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("event beyond retention sends nothing", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithRetention(24*time.Hour))
		if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: time.Now().Add(-48 * time.Hour)}, effect); !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Fatalf("got %v, want ErrBeyondRetention", err)
		}
		r.wantCalls(t)
	})
	t.Run("partitioned claim without an event time", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithDailyPartitions(2))
		r.mock.ExpectBegin()
		r.mock.ExpectRollback()
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: key}); err == nil || !strings.Contains(err.Error(), "partitioned by event day") {
			t.Fatalf("got %v", err)
		}
		r.wantCalls(t, "BEGIN")
	})
	t.Run("no partition for the day", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithDailyPartitions(2))
		at := time.Now().UTC()
		r.mock.ExpectBegin()
		expectClaimAtQuery(r.mock, key, at).WillReturnError(&pq.Error{Code: "23514"})
		expectHorizon(r.mock, nil) // none recorded: the day was never dropped
		r.mock.ExpectRollback()
		if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, effect); !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) || !strings.Contains(err.Error(), "has no partition for event day") {
			t.Fatalf("got %v, want ErrNoPartition (not ErrBeyondRetention) for the missing partition", err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK")
	})
}

func TestWrapNilMessageFunctionOrHandler(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r)
	handler := func(context.Context, *sql.Tx, int) error { return nil }
	msgOf := func(int) (idempotent.Message, error) { return idempotent.Message{Key: "k"}, nil }
	if _, err := idempotent.WrapMessage(mw, nil, handler)(context.Background(), 1); err == nil {
		t.Fatal("nil message function accepted")
	}
	if _, err := idempotent.WrapMessage[int](mw, msgOf, nil)(context.Background(), 1); err == nil {
		t.Fatal("nil handler accepted")
	}
	r.wantCalls(t)
}
