package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// Unit tests of the retry loop: exhaustion, RunTx and the retry policy's
// validation.

func TestRetriesExhausted(t *testing.T) {
	r := newRecorded(t)
	ev := &events{}
	mw := newMiddleware(t, r, idempotent.WithObserver(ev), idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3}))
	var want []string
	for range 3 {
		r.mock.ExpectBegin()
		r.mock.ExpectExec(claimSQL).WithArgs(consumer, key).WillReturnError(&pq.Error{Code: "40001"})
		r.mock.ExpectRollback()
		want = append(want, "BEGIN", claimSQL, "ROLLBACK")
	}

	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
	if got != 0 || !errors.Is(err, idempotent.ErrRetriesExhausted) {
		t.Fatalf("got (%v, %v), want ErrRetriesExhausted", got, err)
	}
	var re *idempotent.RetriesExhaustedError
	if !errors.As(err, &re) || re.Attempts != 3 {
		t.Fatalf("got %v, want a *RetriesExhaustedError with 3 attempts", err)
	}
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "40001" {
		t.Fatalf("got %v, want it to wrap the last attempt's 40001", err)
	}
	if !strings.Contains(re.Error(), "retries exhausted after 3 attempts") || !errors.Is(re.Unwrap(), pqErr) {
		t.Fatalf("RetriesExhaustedError %q", re)
	}
	r.wantCalls(t, want...)
	if len(ev.retries) != 2 || ev.retries[0].Attempt != 1 || ev.retries[1].Attempt != 2 {
		t.Fatalf("retry events %+v, want attempts 1 and 2", ev.retries)
	}
	if e := ev.only(t); e.Attempts != 3 || !errors.Is(e.Err, idempotent.ErrRetriesExhausted) {
		t.Fatalf("event %+v", e)
	}
}

func TestRunTx(t *testing.T) {
	ctx := context.Background()
	one := idempotent.RetryPolicy{MaxAttempts: 1}
	stmt := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (order_id) VALUES (9912) ON CONFLICT DO NOTHING")
		return err
	}
	const stmtSQL = "INSERT INTO ledger (order_id) VALUES (9912) ON CONFLICT DO NOTHING"
	expectStmt := func(m sqlmock.Sqlmock) *sqlmock.ExpectedExec { return m.ExpectExec(stmtSQL) }

	t.Run("commits", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectStmt(r.mock).WillReturnResult(sqlmock.NewResult(0, 1))
		r.mock.ExpectCommit()
		if err := idempotent.RunTx(ctx, r.db, pg, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, one, stmt); err != nil {
			t.Fatal(err)
		}
		r.wantCalls(t, "BEGIN Repeatable Read", stmtSQL, "COMMIT")
	})
	t.Run("error rolls back", func(t *testing.T) {
		r := newRecorded(t)
		failed := &pq.Error{Code: "23503"}
		r.mock.ExpectBegin()
		expectStmt(r.mock).WillReturnError(failed)
		r.mock.ExpectRollback()
		if err := idempotent.RunTx(ctx, r.db, pg, nil, idempotent.DefaultRetryPolicy(), stmt); !errors.Is(err, failed) {
			t.Fatalf("got %v, want the statement's error", err)
		}
		r.wantCalls(t, "BEGIN", stmtSQL, "ROLLBACK")
	})
	t.Run("retries a failed commit", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectStmt(r.mock).WillReturnResult(sqlmock.NewResult(0, 1))
		r.mock.ExpectCommit().WillReturnError(&pq.Error{Code: "40P01"})
		r.mock.ExpectBegin()
		expectStmt(r.mock).WillReturnResult(sqlmock.NewResult(0, 0))
		r.mock.ExpectCommit()
		if err := idempotent.RunTx(ctx, r.db, pg, nil, idempotent.RetryPolicy{MaxAttempts: 2}, stmt); err != nil {
			t.Fatal(err)
		}
		r.wantCalls(t, "BEGIN", stmtSQL, "COMMIT", "BEGIN", stmtSQL, "COMMIT")
	})
	t.Run("exhausted", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		expectStmt(r.mock).WillReturnError(&pq.Error{Code: "40001"})
		expectProbe(r.mock, aborted)
		r.mock.ExpectRollback()
		err := idempotent.RunTx(ctx, r.db, pg, nil, one, stmt)
		var re *idempotent.RetriesExhaustedError
		if !errors.As(err, &re) || re.Attempts != 1 {
			t.Fatalf("got %v, want RetriesExhaustedError after 1 attempt", err)
		}
		r.wantCalls(t, "BEGIN", stmtSQL, dialect.ProbeSavepointSQL, "ROLLBACK")
	})
	t.Run("panic rolls back", func(t *testing.T) {
		r := newRecorded(t)
		r.mock.ExpectBegin()
		r.mock.ExpectRollback()
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v", p)
				}
			}()
			_ = idempotent.RunTx(ctx, r.db, pg, nil, one, func(context.Context, *sql.Tx) error { panic("boom") })
		}()
		r.wantCalls(t, "BEGIN", "ROLLBACK")
	})
	t.Run("rejects", func(t *testing.T) {
		r := newRecorded(t)
		noop := func(context.Context, *sql.Tx) error { return nil }
		for name, err := range map[string]error{
			"nil db":       idempotent.RunTx(ctx, nil, pg, nil, one, noop),
			"nil dialect":  idempotent.RunTx(ctx, r.db, nil, nil, one, noop),
			"nil function": idempotent.RunTx(ctx, r.db, pg, nil, one, nil),
		} {
			if err == nil || !strings.Contains(err.Error(), "nil db, dialect or function") {
				t.Errorf("%s: got %v", name, err)
			}
		}
		err := idempotent.RunTx(ctx, r.db, pg, nil, idempotent.RetryPolicy{}, noop)
		if err == nil || !strings.Contains(err.Error(), "MaxAttempts is 0") {
			t.Errorf("zero policy: got %v", err)
		}
		r.wantCalls(t)
	})
}

func TestRetryPolicyValidation(t *testing.T) {
	cases := []struct {
		p    idempotent.RetryPolicy
		want string // "" for valid
	}{
		{idempotent.DefaultRetryPolicy(), ""},
		{idempotent.RetryPolicy{MaxAttempts: 1}, ""},
		{idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, MaxBackoff: time.Second}, ""},
		{idempotent.RetryPolicy{MaxAttempts: 0}, "MaxAttempts is 0, want at least 1"},
		{idempotent.RetryPolicy{MaxAttempts: -3}, "MaxAttempts is -3"},
		{idempotent.RetryPolicy{MaxAttempts: 1, InitialBackoff: -time.Millisecond}, "InitialBackoff is negative (-1ms)"},
		{idempotent.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff 1ms is less than InitialBackoff 1s"},
	}
	db, _ := sqlmockDB(t)
	for _, c := range cases {
		_, err := idempotent.New(db, pg, consumer, idempotent.WithRetry(c.p))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.p, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), "WithRetry: retry policy: "+c.want)):
			t.Errorf("%+v: got %v, want %q", c.p, err, c.want)
		}
	}
	if p := idempotent.DefaultRetryPolicy(); p.MaxAttempts != 10 || p.InitialBackoff != 5*time.Millisecond || p.MaxBackoff != time.Second {
		t.Errorf("DefaultRetryPolicy() = %+v, want the documented 10 attempts, 5ms to 1s", p)
	}
}

// TestBackoffObserved checks the backoffs the middleware reports, and
// sleeps, stay within the policy's documented bounds.
func TestBackoffObserved(t *testing.T) {
	r := newRecorded(t)
	ev := &events{}
	mw := newMiddleware(t, r, idempotent.WithObserver(ev),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 4, InitialBackoff: 2 * time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	for range 3 {
		r.mock.ExpectBegin()
		r.mock.ExpectExec(claimSQL).WithArgs(consumer, key).WillReturnError(&pq.Error{Code: "40001"})
		r.mock.ExpectRollback()
	}
	expectApplied(r.mock, key)
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	bounds := [][2]time.Duration{{time.Millisecond, 2 * time.Millisecond}, {2 * time.Millisecond, 4 * time.Millisecond}, {2500 * time.Microsecond, 5 * time.Millisecond}}
	if len(ev.retries) != 3 {
		t.Fatalf("retry events %+v", ev.retries)
	}
	for i, re := range ev.retries {
		if re.Backoff < bounds[i][0] || re.Backoff > bounds[i][1] {
			t.Errorf("backoff after attempt %d: %v, want within %v", i+1, re.Backoff, bounds[i])
		}
	}
	if e := ev.only(t); e.Duration < ev.retries[0].Backoff+ev.retries[1].Backoff+ev.retries[2].Backoff {
		t.Errorf("delivery took %v, less than its backoffs: the middleware did not sleep", e.Duration)
	}
}

// sqlmockDB returns a database on a mock with no expectations, for tests of
// New, which must send nothing.
func sqlmockDB(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	r := newRecorded(t)
	t.Cleanup(func() { r.wantCalls(t) })
	return r.db, r.mock
}

// TestRetryPolicyRun: the one retry loop, as the driver packages call it.
func TestRetryPolicyRun(t *testing.T) {
	ctx := context.Background()
	p := idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond, MaxBackoff: time.Microsecond}
	serialization := dialect.Class{Kind: dialect.KindSerialization, Code: "40001"}
	boom := errors.New("boom")
	type retry struct {
		attempt int
		class   dialect.Class
	}
	for _, c := range []struct {
		name     string
		fails    []dialect.Class // the class of each failing attempt; then success
		err      error           // the failure of every failing attempt
		want     int             // attempts made
		wantErr  func(error) bool
		retrieds []retry
	}{
		{"success at once", nil, nil, 1, func(err error) bool { return err == nil }, nil},
		{"retried, then success", []dialect.Class{serialization}, boom, 2, func(err error) bool { return err == nil }, []retry{{1, serialization}}},
		{"not retryable", []dialect.Class{{}}, boom, 1, func(err error) bool { return errors.Is(err, boom) && !errors.Is(err, idempotent.ErrRetriesExhausted) }, nil},
		{"a context error is never retried", []dialect.Class{serialization}, context.DeadlineExceeded, 1, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }, nil},
		{"exhausted", []dialect.Class{serialization, serialization, serialization, serialization}, boom, 3, func(err error) bool {
			var re *idempotent.RetriesExhaustedError
			return errors.As(err, &re) && re.Attempts == 3 && errors.Is(err, boom) && errors.Is(err, idempotent.ErrRetriesExhausted)
		}, []retry{{1, serialization}, {2, serialization}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			var got []retry
			attempts, err := p.Run(ctx, func(context.Context) (dialect.Class, error) {
				n++
				if n <= len(c.fails) {
					return c.fails[n-1], c.err
				}
				return dialect.Class{}, nil
			}, func(attempt int, class dialect.Class, err error, backoff time.Duration) {
				if !errors.Is(err, c.err) || backoff > time.Microsecond {
					t.Errorf("retried with %v after %v", err, backoff)
				}
				got = append(got, retry{attempt, class})
			})
			if attempts != c.want || n != c.want || !c.wantErr(err) {
				t.Fatalf("Run = (%d, %v) after %d attempts, want %d", attempts, err, n, c.want)
			}
			if !slices.Equal(got, c.retrieds) {
				t.Fatalf("retried %v, want %v", got, c.retrieds)
			}
		})
	}
	t.Run("the context ends", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		attempts, err := p.Run(cctx, func(context.Context) (dialect.Class, error) {
			cancel()
			return serialization, boom
		}, nil)
		if attempts != 1 || !errors.Is(err, context.Canceled) || !errors.Is(err, boom) {
			t.Fatalf("Run = (%d, %v), want one attempt and an error matching both", attempts, err)
		}
	})
}
