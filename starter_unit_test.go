package idempotent_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// Unit tests of the Starter hook: an Observer that implements it derives the
// context every attempt, retry report and outcome report of a delivery gets.

type deliveryMark struct{}

// starter is an Observer and Starter that marks the context it starts and
// checks that the same mark comes back in Retry and Outcome.
type starter struct {
	events
	r      *recorded
	starts []string // consumer/key of each Start
	unseen int      // Retry or Outcome calls without the mark
	early  []string // driver calls made before Start
}

func (s *starter) Start(ctx context.Context, consumer, key string) context.Context {
	s.starts = append(s.starts, consumer+"/"+key)
	s.early = s.r.calls()
	return context.WithValue(ctx, deliveryMark{}, consumer+"/"+key)
}

func (s *starter) Outcome(ctx context.Context, e idempotent.Event) {
	if ctx.Value(deliveryMark{}) != e.Consumer+"/"+e.Key {
		s.unseen++
	}
	s.events.Outcome(ctx, e)
}

func (s *starter) Retry(ctx context.Context, e idempotent.RetryEvent) {
	if ctx.Value(deliveryMark{}) != e.Consumer+"/"+e.Key {
		s.unseen++
	}
	s.events.Retry(ctx, e)
}

var _ idempotent.Starter = (*starter)(nil)

func TestStarterContextReachesAttemptsRetryAndOutcome(t *testing.T) {
	// marked fails unless ctx carries the delivery's mark.
	marked := func(t *testing.T, ctx context.Context) {
		t.Helper()
		if ctx.Value(deliveryMark{}) != consumer+"/"+key {
			t.Errorf("the handler's context lacks the Starter's value")
		}
	}
	// Each entry point fails its first attempt with a 40001 and applies on
	// the second.
	for _, tc := range []struct {
		name   string
		script func(r *recorded)
		call   func(t *testing.T, mw *idempotent.Middleware) (idempotent.Outcome, error)
	}{
		{"ProcessMessage", scriptClaimRetry, func(t *testing.T, mw *idempotent.Middleware) (idempotent.Outcome, error) {
			return mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
				marked(t, ctx)
				return effect(ctx, tx)
			})
		}},
		{"WrapMessage", scriptClaimRetry, func(t *testing.T, mw *idempotent.Middleware) (idempotent.Outcome, error) {
			h := idempotent.WrapMessage(mw, func(k string) (idempotent.Message, error) { return idempotent.Message{Key: k}, nil }, func(ctx context.Context, tx *sql.Tx, _ string) error {
				marked(t, ctx)
				return effect(ctx, tx)
			})
			return h(context.Background(), key)
		}},
		{"ProcessMessageTx", scriptClaimRetry, func(t *testing.T, mw *idempotent.Middleware) (idempotent.Outcome, error) {
			begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
				marked(t, ctx)
				tx, err := db.BeginTx(ctx, opts)
				return tx, tx, err
			}
			return idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, func(ctx context.Context, tx *sql.Tx) error {
				marked(t, ctx)
				return effect(ctx, tx)
			})
		}},
		{"ProcessNatural", func(r *recorded) {
			r.mock.ExpectBegin()
			r.mock.ExpectExec(effectSQL).WillReturnError(&pq.Error{Code: "40001"})
			r.mock.ExpectRollback()
			r.mock.ExpectBegin()
			expectEffect(r.mock)
			r.mock.ExpectCommit()
		}, func(t *testing.T, mw *idempotent.Middleware) (idempotent.Outcome, error) {
			return mw.ProcessNatural(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
				marked(t, ctx)
				return true, effect(ctx, tx)
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorded(t)
			s := &starter{r: r}
			mw := newMiddleware(t, r, idempotent.WithObserver(s))
			tc.script(r)
			if got, err := tc.call(t, mw); got != idempotent.Applied || err != nil {
				t.Fatalf("got (%v, %v), want Applied", got, err)
			}
			if len(s.starts) != 1 || s.starts[0] != consumer+"/"+key {
				t.Fatalf("Start calls %v, want one for %s/%s", s.starts, consumer, key)
			}
			if len(s.early) != 0 {
				t.Errorf("Start came after driver calls %v, want before the first attempt", s.early)
			}
			if len(s.retries) != 1 || s.only(t).Attempts != 2 {
				t.Fatalf("%d retries and outcome %+v, want one retry and 2 attempts", len(s.retries), s.outcomes)
			}
			if s.unseen != 0 {
				t.Errorf("%d Retry or Outcome calls without the Starter's context", s.unseen)
			}
		})
	}
}

func scriptClaimRetry(r *recorded) {
	r.mock.ExpectBegin()
	r.mock.ExpectExec(claimSQL).WithArgs(consumer, key).WillReturnError(&pq.Error{Code: "40001"})
	r.mock.ExpectRollback()
	expectApplied(r.mock, key)
}

// An invalid key is reported in a delivery that was started: a tracing
// observer's span ends with the error.
func TestStarterSeesRejectedKey(t *testing.T) {
	r := newRecorded(t)
	s := &starter{r: r}
	mw := newMiddleware(t, r, idempotent.WithObserver(s))
	if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: ""}, effect); err == nil {
		t.Fatal("empty key accepted")
	}
	if len(s.starts) != 1 || s.only(t).Err == nil || s.unseen != 0 {
		t.Fatalf("starts %v, outcome %+v, %d calls without the mark", s.starts, s.outcomes, s.unseen)
	}
}

// A Start that returns nil leaves the caller's context in place.
func TestStarterNilContext(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r, idempotent.WithObserver(&nilStarter{}))
	expectApplied(r.mock, key)
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); got != idempotent.Applied || err != nil {
		t.Fatalf("got (%v, %v), want Applied", got, err)
	}
}

type nilStarter struct{ idempotent.Counts }

func (*nilStarter) Start(context.Context, string, string) context.Context { return nil }
