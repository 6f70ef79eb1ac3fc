package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// RetryPolicy says how often and how patiently a transaction is run again
// after a retryable failure: a serialization failure (SQLSTATE 40001), a
// deadlock (40P01) or a lost connection, as classified by the dialect.
//
// The whole transaction is retried: rolled back, then begun again with the
// claim and the handler run anew. Between attempts the middleware sleeps with
// no transaction open, for an exponentially growing backoff with jitter,
// and stops early if the context ends.
type RetryPolicy struct {
	// MaxAttempts is how many times the transaction may run in all; 1 means
	// no retry. It must be at least 1.
	MaxAttempts int
	// InitialBackoff is the sleep before the second attempt; each later
	// sleep doubles it, up to MaxBackoff. Each sleep is drawn at random from
	// the upper half of its value, so retrying workers spread out.
	InitialBackoff time.Duration
	// MaxBackoff caps the sleep between attempts.
	MaxBackoff time.Duration
}

// DefaultRetryPolicy returns the policy used when WithRetry is not given:
// 10 attempts, backoff from 5ms doubling up to 1s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 10, InitialBackoff: 5 * time.Millisecond, MaxBackoff: time.Second}
}

func (p RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 1:
		return fmt.Errorf("retry policy: MaxAttempts is %d, want at least 1", p.MaxAttempts)
	case p.InitialBackoff < 0:
		return fmt.Errorf("retry policy: InitialBackoff is negative (%v)", p.InitialBackoff)
	case p.MaxBackoff < p.InitialBackoff:
		return fmt.Errorf("retry policy: MaxBackoff %v is less than InitialBackoff %v", p.MaxBackoff, p.InitialBackoff)
	}
	return nil
}

// backoff returns the sleep after the given failed attempt (1-based).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		if d > p.MaxBackoff/2 {
			d = p.MaxBackoff // doubling would pass the cap, or overflow
			break
		}
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// RunTx runs fn in a transaction on db, committing if fn returns nil and
// rolling back otherwise, and runs it again under policy p when it fails with
// an error the dialect classifies as retryable. opts may be nil.
//
// RunTx is the retry loop of Process without the claim: use it for work that
// is idempotent by other means, such as a natural-key insert. The same guard
// as Process applies (see GuardConnector). A panic in fn rolls back and
// re-panics. After p.MaxAttempts failed attempts the error matches
// ErrRetriesExhausted and wraps the last failure.
func RunTx(ctx context.Context, db *sql.DB, d dialect.Dialect, opts *sql.TxOptions, p RetryPolicy, fn TxFunc) error {
	if db == nil || d == nil || fn == nil {
		return errors.New("idempotent: RunTx: nil db, dialect or function")
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("idempotent: RunTx: %w", err)
	}
	r := runner{db: db, d: d, txOpts: opts, policy: p}
	r.implicit, _ = d.(dialect.ImplicitCommitter)
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error { return fn(ctx, tx) })
	return err
}

// runner is the transaction-and-retry loop shared by Process and RunTx.
type runner struct {
	db      *sql.DB
	d       dialect.Dialect
	txOpts  *sql.TxOptions
	policy  RetryPolicy
	onRetry func(ctx context.Context, key string, attempt int, class dialect.Class, err error, backoff time.Duration)
	// beforeCommit, when set, runs after fn succeeded and before COMMIT.
	beforeCommit func(ctx context.Context, tx *sql.Tx, st *attemptState) error
	// begin, when set, begins each attempt's transaction instead of
	// db.BeginTx (see ProcessTx).
	begin func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error)
	// implicit, when set, goes into each attempt's guard token (see
	// dialect.ImplicitCommitter).
	implicit dialect.ImplicitCommitter
	// afterFailure, when set, runs after the body (not beforeCommit) failed
	// with an error that is not retryable, before the rollback; an error it
	// returns is joined to the failure and makes it final (the strict
	// guard's check on the error path). A retryable failure is skipped: a
	// deadlock ends the transaction on the database's side by design.
	afterFailure func(ctx context.Context, tx *sql.Tx, st *attemptState) error
}

// attemptState is what one attempt's body tells the loop.
type attemptState struct {
	token *txToken
	// skipCommit makes the attempt roll back instead of committing when the
	// body returns nil (a duplicate has nothing to commit).
	skipCommit bool
	// txid is the strict guard's transaction id read after the claim.
	txid string
}

// run runs body in transactions until one commits, an error is not
// retryable, the policy is exhausted or ctx ends. It returns the number of
// attempts made. key is only passed on to onRetry.
func (r *runner) run(ctx context.Context, key string, body func(context.Context, *sql.Tx, *attemptState) error) (int, error) {
	for attempt := 1; ; attempt++ {
		class, err := r.once(ctx, body)
		if err == nil {
			return attempt, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			if errors.Is(err, ctxErr) {
				return attempt, err
			}
			return attempt, errors.Join(ctxErr, err)
		}
		if !class.Retryable() {
			return attempt, err
		}
		if attempt >= r.policy.MaxAttempts {
			return attempt, &RetriesExhaustedError{Attempts: attempt, Err: err}
		}
		wait := r.policy.backoff(attempt)
		if r.onRetry != nil {
			r.onRetry(ctx, key, attempt, class, err, wait)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return attempt, errors.Join(serr, err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// once runs one attempt: begin, body, commit (or rollback). It returns the
// error and its classification; the classification is of the failure that
// decided the attempt, never of a rollback error joined to it.
func (r *runner) once(ctx context.Context, body func(context.Context, *sql.Tx, *attemptState) error) (class dialect.Class, err error) {
	// One allocation for the attempt's state and its token.
	a := &struct {
		st  attemptState
		tok txToken
	}{}
	st := &a.st
	st.token = &a.tok
	a.tok.implicit = r.implicit
	tctx := context.WithValue(ctx, tokenKey{}, st.token)
	tx, err := r.beginTx(tctx)
	if err != nil {
		return r.d.Classify(err), fmt.Errorf("idempotent: begin: %w", err)
	}
	done := false
	defer func() {
		if !done {
			// body panicked: roll back so the connection returns to the
			// pool, then let the panic go on.
			_ = tx.Rollback()
		}
	}()
	err = body(tctx, tx, st)
	bodyFailed := err != nil
	if err == nil && st.skipCommit {
		done = true
		if rbErr := tx.Rollback(); rbErr != nil && ctx.Err() == nil {
			return r.d.Classify(rbErr), fmt.Errorf("idempotent: rollback: %w", rbErr)
		}
		return dialect.Class{}, nil
	}
	if err == nil {
		err = st.token.violation()
	}
	if err == nil && r.beforeCommit != nil {
		err = r.beforeCommit(tctx, tx, st)
	}
	if err != nil {
		done = true
		class = r.d.Classify(err)
		if r.afterFailure != nil && bodyFailed && !class.Retryable() {
			if ferr := r.afterFailure(tctx, tx, st); ferr != nil {
				err = errors.Join(err, ferr)
				class = dialect.Class{}
			}
		}
		if rbErr := tx.Rollback(); rbErr != nil {
			switch {
			case errors.Is(rbErr, sql.ErrTxDone) && ctx.Err() == nil:
				// The body ended the transaction itself. The strict guard
				// may have said so already (it found the tx done before
				// commit); say it once.
				if !errors.Is(err, ErrAutocommit) {
					err = errors.Join(err, fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit))
				}
				class = dialect.Class{}
			case errors.Is(rbErr, sql.ErrTxDone), class.Kind == dialect.KindConnection:
				// Already rolled back by a cancelled context or a lost
				// connection: nothing to report.
			default:
				err = errors.Join(err, fmt.Errorf("idempotent: rollback after failure: %w", rbErr))
			}
		}
		if v := st.token.violation(); v != nil && !errors.Is(err, ErrAutocommit) {
			// The handler swallowed the guard's error and failed otherwise.
			err = errors.Join(err, v)
			class = dialect.Class{}
		}
		return class, err
	}
	done = true
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
			return dialect.Class{}, fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit)
		}
		return r.d.Classify(err), fmt.Errorf("idempotent: commit: %w", err)
	}
	return dialect.Class{}, nil
}
