package idempotent

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// RetryPolicy says how often and how patiently a transaction is run again
// after a retryable failure of its own: a serialization failure (SQLSTATE
// 40001), a deadlock (40P01) or the loss of its connection, as classified
// by the dialect. An error the handler returns is retried only when the
// transaction itself suffered it; an error matching context.Canceled or
// context.DeadlineExceeded never is. The package documentation has the
// full table.
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

// Backoff returns the sleep after the given failed attempt (1-based), as
// every retry loop of this module and its adapters takes it: InitialBackoff
// doubled for each attempt after the first, capped at MaxBackoff, then drawn
// at random from the upper half of that, so that consumers that failed
// together do not retry together. A policy whose backoffs are 0 returns 0.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
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
// rolling back otherwise, and runs it again under policy p when the
// transaction fails with an error the dialect classifies as retryable: fn's
// error is retried only when the transaction itself suffered it (see the
// package documentation). opts may be nil.
//
// RunTx is the retry loop of ProcessMessage without the claim: use it for work that
// is idempotent by other means, such as a natural-key insert. The same guard
// as ProcessMessage applies (see GuardConnector), and like every entry point that
// begins a transaction it refuses a handler's context with ErrAutocommit. A
// panic in fn rolls back and re-panics. After p.MaxAttempts failed attempts
// the error matches ErrRetriesExhausted and wraps the last failure.
func RunTx(ctx context.Context, db *sql.DB, d dialect.Dialect, opts *sql.TxOptions, p RetryPolicy, fn TxFunc) error {
	if db == nil || d == nil || fn == nil {
		return errors.New("idempotent: RunTx: nil db, dialect or function")
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("idempotent: RunTx: %w", err)
	}
	r := runner{db: db, d: d, txOpts: opts, policy: p}
	r.guardDialect(d)
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		st.inHandler = true
		return fn(ctx, tx)
	})
	return err
}

// runner is the transaction-and-retry loop shared by every entry point and RunTx.
type runner struct {
	db      *sql.DB
	d       dialect.Dialect
	txOpts  *sql.TxOptions
	policy  RetryPolicy
	onRetry func(ctx context.Context, key string, attempt int, class dialect.Class, err error, backoff time.Duration)
	// beforeCommit, when set, runs after fn succeeded and before COMMIT.
	beforeCommit func(ctx context.Context, tx *sql.Tx, st *attemptState) error
	// begin, when set, begins each attempt's transaction instead of
	// db.BeginTx (see ProcessMessageTx).
	begin func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error)
	// implicit and rollbacks, when set, go into each attempt's guard token
	// (see dialect.ImplicitCommitter and dialect.ImplicitRollbacker).
	implicit  dialect.ImplicitCommitter
	rollbacks dialect.ImplicitRollbacker
	// afterFailure, when set, runs after the body (not beforeCommit) failed
	// with an error that is not retryable, before the rollback; an error it
	// returns is joined to the failure and makes it final (the strict
	// guard's check on the error path). A retryable failure is skipped: a
	// deadlock ends the transaction on the database's side by design.
	afterFailure func(ctx context.Context, tx *sql.Tx, st *attemptState) error
	// seenScope is the Middleware's pre-check scope, forgotten when an
	// attempt loses its connection (lostConnection); nil for RunTx.
	seenScope *preCheckScopes
}

// guardDialect gives r's guard tokens d's tests for statements that
// commit implicitly and failures that roll back implicitly, where d has
// them: the entry points that run a caller's function (Middleware, RunTx)
// call it.
func (r *runner) guardDialect(d dialect.Dialect) {
	r.implicit, _ = d.(dialect.ImplicitCommitter)
	r.rollbacks, _ = d.(dialect.ImplicitRollbacker)
}

// attemptState is what one attempt's body tells the loop.
type attemptState struct {
	token *txToken
	// skipCommit makes the attempt roll back instead of committing when the
	// body returns nil (a duplicate has nothing to commit).
	skipCommit bool
	// txid is the strict guard's transaction id read after the claim.
	txid string
	// inHandler is set by the body just before it calls the caller's
	// function: a failure from then on is the handler's, retried only when
	// the transaction itself suffered it (see suffered).
	inHandler bool
}

// run runs body in transactions until one commits, an error is not
// retryable, the policy is exhausted or ctx ends (RetryPolicy.Run). It
// returns the number of attempts made. key is only passed on to onRetry.
//
// A ctx that carries a claim's token is a handler's: run refuses it at once,
// before taking a connection (see refuseNested).
func (r *runner) run(ctx context.Context, key string, body func(context.Context, *sql.Tx, *attemptState) error) (int, error) {
	if err := refuseNested(ctx); err != nil {
		return 0, err
	}
	var retried func(attempt int, class dialect.Class, err error, backoff time.Duration)
	if r.onRetry != nil {
		retried = func(attempt int, class dialect.Class, err error, backoff time.Duration) {
			r.onRetry(ctx, key, attempt, class, err, backoff)
		}
	}
	return r.policy.Run(ctx, func(ctx context.Context) (dialect.Class, error) { return r.once(ctx, body) }, retried)
}

// Run is the one retry loop of this module and of the driver packages
// built on it (idempgx): it runs attempt until it succeeds, fails with an
// error whose class is not retryable, or that matches context.Canceled or
// context.DeadlineExceeded, the policy's MaxAttempts are used up (the error
// is then a *RetriesExhaustedError wrapping the last failure) or ctx ends
// (the error then matches ctx.Err() too). Between attempts it sleeps for
// Backoff(attempt), with no transaction open — attempt must have ended its
// transaction, committed or rolled back, before it returns — and first
// tells retried, if not nil, of the failure it is about to retry.
//
// attempt runs one whole transaction and returns its failure with the
// dialect's classification of the failure that decided it (dialect.Class{}
// for one that must not be retried, such as a handler's own error). It
// returns the number of attempts made.
func (p RetryPolicy) Run(ctx context.Context, attempt func(ctx context.Context) (dialect.Class, error), retried func(attempt int, class dialect.Class, err error, backoff time.Duration)) (int, error) {
	for n := 1; ; n++ {
		class, err := attempt(ctx)
		if err == nil {
			return n, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			if errors.Is(err, ctxErr) {
				return n, err
			}
			return n, errors.Join(ctxErr, err)
		}
		if !class.Retryable() || contextError(err) {
			return n, err
		}
		if n >= p.MaxAttempts {
			return n, &RetriesExhaustedError{Attempts: n, Err: err}
		}
		wait := p.Backoff(n)
		if retried != nil {
			retried(n, class, err, wait)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return n, errors.Join(serr, err)
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
	defer func() { r.lostConnection(class) }()
	// One allocation for the attempt's state and its token.
	a := &struct {
		st  attemptState
		tok txToken
	}{}
	st := &a.st
	st.token = &a.tok
	a.tok.implicit, a.tok.rollbacks = r.implicit, r.rollbacks
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
			_ = endTx(st, tx, false)
		}
	}()
	err = body(tctx, tx, st)
	bodyFailed := err != nil
	if err == nil && st.skipCommit {
		done = true
		if rbErr := endTx(st, tx, false); rbErr != nil && ctx.Err() == nil {
			return r.d.Classify(rbErr), fmt.Errorf("idempotent: rollback: %w", rbErr)
		}
		return dialect.Class{}, nil
	}
	if err == nil {
		st.inHandler = false // what follows is the middleware's own
		err = st.token.violation()
	}
	if err == nil {
		if why := st.token.endedBy(); why != nil {
			// The handler returned nil after the database rolled the
			// transaction back (a deadlock it swallowed, on MySQL): a
			// COMMIT now would commit nothing, and report it applied.
			err = fmt.Errorf("%w: the handler returned nil after %w: nothing of this attempt is committed", ErrAutocommit, why)
		}
	}
	if err == nil && r.beforeCommit != nil {
		err = r.beforeCommit(ctx, tx, st)
	}
	if err != nil {
		done = true
		failure := r.d.Classify(err)
		class = failure
		if errors.Is(err, ErrAutocommit) {
			// A handler's bug, never retried, whatever failure it wraps
			// (a deadlock it swallowed).
			class = dialect.Class{}
		}
		if st.inHandler && class.Retryable() && !r.suffered(ctx, tx, class, err) {
			// The handler met the failure elsewhere: its own to return.
			class = dialect.Class{}
		}
		if r.afterFailure != nil && bodyFailed && !class.Retryable() && st.token.violation() == nil {
			if ferr := r.afterFailure(ctx, tx, st); ferr != nil {
				err = errors.Join(err, ferr)
				class = dialect.Class{}
			}
		}
		if rbErr := endTx(st, tx, false); rbErr != nil {
			switch {
			case errors.Is(rbErr, sql.ErrTxDone) && ctx.Err() == nil:
				// The body ended the transaction itself (with the guard,
				// which rolled it back, the violation says so). The strict
				// guard may have said so already (it found the tx done
				// before commit); say it once.
				if !errors.Is(err, ErrAutocommit) {
					cause := st.token.violation()
					if cause == nil {
						cause = fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit)
					}
					err = errors.Join(err, cause)
				}
				class = dialect.Class{}
			case errors.Is(rbErr, sql.ErrTxDone), failure.Kind == dialect.KindConnection, r.lost(rbErr):
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
	if err := endTx(st, tx, true); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
			return dialect.Class{}, fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit)
		}
		return r.d.Classify(err), fmt.Errorf("idempotent: commit: %w", err)
	}
	return dialect.Class{}, nil
}

// endTx commits tx, or rolls it back, as the middleware: it marks the
// attempt's token first, so that GuardConnector lets it through (a
// handler's own tx.Commit or tx.Rollback is refused).
func endTx(st *attemptState, tx *sql.Tx, commit bool) error {
	st.token.ending.Store(true)
	if commit {
		return tx.Commit()
	}
	return tx.Rollback()
}

// refuseNested fails when ctx carries a claim's token: it is a handler's
// context, or derives from one, and a transaction begun with it would commit
// on its own, apart from the claim's transaction — surviving the claim's
// rollback, or (with the same key) waiting on the claim forever. The
// handler's transaction is marked, so it rolls back even if the handler
// ignores the error.
func refuseNested(ctx context.Context) error {
	t := tokenFrom(ctx)
	if t == nil {
		return nil
	}
	err := fmt.Errorf("%w: a transaction was begun inside a handler, with the handler's context: it would commit apart from the claim's transaction (do the work through the handler's *sql.Tx, or see the package documentation for independent work)", ErrAutocommit)
	t.violate(err)
	return err
}

// contextError reports whether err matches context.Canceled or
// context.DeadlineExceeded. Such a failure is never retried: the caller's
// context ended, or the handler bounded its own work and ran out of time.
func contextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// lost reports whether err says the connection is gone.
func (r *runner) lost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || r.d.Classify(err).Kind == dialect.KindConnection
}

// suffered reports whether the claim's transaction itself suffered the
// handler's failure err, which the dialect classifies as c (retryable). It
// asks the transaction (see dialect.ProbeSavepointSQL): a lost connection
// explains any failure; an aborted transaction explains a serialization
// failure or deadlock; a transaction still alive and open explains none —
// the handler met the failure on another database or connection, or in a
// call of its own, and returns it. A context error is never the
// transaction's.
func (r *runner) suffered(ctx context.Context, tx *sql.Tx, c dialect.Class, err error) bool {
	if contextError(err) || ctx.Err() != nil {
		return false
	}
	for _, q := range [...]string{dialect.ProbeSavepointSQL, dialect.ProbeReleaseSQL} {
		if _, perr := tx.ExecContext(ctx, q); perr != nil {
			return r.lost(perr) || c.Kind == dialect.KindSerialization
		}
	}
	return false
}
