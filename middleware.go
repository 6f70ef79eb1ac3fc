package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/horizonlease"
	"github.com/txclaim/idempotent/internal/seencheck"
)

// Outcome is how a delivery ended when it did not fail. A delivery that
// failed returns the zero Outcome with its error; the zero Outcome prints
// as "none".
type Outcome int

const (
	// Applied means the claim was new: the handler ran and its effect
	// committed together with the claim.
	Applied Outcome = iota + 1
	// Duplicate means the claim already existed: the message was applied
	// before (or by a concurrent delivery), and the handler did not run.
	Duplicate
)

// String returns "applied", "duplicate", "parked", or "none" for the zero
// Outcome (a failed delivery's).
func (o Outcome) String() string {
	switch o {
	case 0:
		return "none"
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Parked:
		return "parked"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// TxFunc is work run inside a transaction. It must do all its database work
// through tx and with ctx, and must not commit or roll back tx.
type TxFunc func(ctx context.Context, tx *sql.Tx) error

// Handler applies one message's effect inside the claim's transaction.
type Handler[M any] func(ctx context.Context, tx *sql.Tx, msg M) error

// Middleware applies message effects exactly once for one consumer. It is
// safe for concurrent use; create one per consumer and share it.
type Middleware struct {
	db          *sql.DB
	d           dialect.Dialect
	consumer    string
	consumerArg any // consumer as a statement argument, boxed once
	table       dialect.Table
	claimSQL    string
	// hclaimSQL is the claim statement with the horizon folded in
	// (dialect.HorizonClaimer), "" when the dialect reads it after the
	// claim or keeps none.
	hclaimSQL   string
	hk          dialect.HorizonKeeper // nil when the dialect keeps no horizon
	lease       *horizonlease.Cache   // WithHorizonLease's cached horizon; nil reads it in every claim
	lockSQL     string
	lockReset   string
	txidSQL     string
	lockTimeout time.Duration
	maxKey      int
	observer    Observer
	run         runner
	ret         retention
	seen        Seen
	seenBatch   SeenBatch                  // SeenBatchOf(seen), for batches
	seenScope   seencheck.Scope[SeenScope] // see SeenScope
	co          *coalescer                 // nil without WithCoalescing
	ord         *orderer                   // nil without WithOrdering
}

// New returns a Middleware that records claims for consumer in the claim
// table of db, speaking dialect d. consumer names the service applying the
// effects: several consumers may share one table, each with its own claims.
// It must be 1 to 128 bytes of ASCII letters, digits and . _ - : /, starting
// with a letter or digit.
//
// New sends nothing to the database; call EnsureSchema (or run the
// migration) before the first message.
func New(db *sql.DB, d dialect.Dialect, consumer string, opts ...Option) (*Middleware, error) {
	if db == nil {
		return nil, errors.New("idempotent: New: nil *sql.DB")
	}
	if d == nil {
		return nil, errors.New("idempotent: New: nil dialect")
	}
	if err := validateConsumer(consumer); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idempotent: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	table, err := dialect.ParseTable(cfg.table)
	if err != nil {
		return nil, fmt.Errorf("idempotent: %w", err)
	}
	m := &Middleware{
		db:          db,
		d:           d,
		consumer:    consumer,
		consumerArg: consumer,
		table:       table,
		claimSQL:    d.ClaimSQL(table),
		lockTimeout: cfg.lockTimeout,
		maxKey:      d.MaxKeyBytes(),
		observer:    cfg.observer,
		seen:        cfg.seen,
		seenBatch:   SeenBatchOf(cfg.seen),
	}
	if cfg.lockTimeout > 0 {
		if m.lockSQL = d.LockTimeoutSQL(cfg.lockTimeout); m.lockSQL == "" {
			return nil, fmt.Errorf("idempotent: WithLockTimeout: the %s dialect cannot bound lock waits", d.Name())
		}
		if r, ok := d.(dialect.LockTimeoutResetter); ok {
			m.lockReset = r.LockTimeoutResetSQL()
		}
	}
	if cfg.strictGuard {
		if m.txidSQL = d.TxIDSQL(); m.txidSQL == "" {
			return nil, fmt.Errorf("idempotent: WithStrictGuard: the %s dialect cannot identify transactions", d.Name())
		}
	}
	m.run = runner{db: db, d: d, policy: cfg.retry, seenScope: &m.seenScope}
	m.seenScope.Now = cfg.retention.clock
	m.run.guardDialect(d)
	if cfg.txOpts != (sql.TxOptions{}) {
		if c, ok := d.(dialect.TxOptionsChecker); ok {
			if err := c.CheckTxOptions(cfg.txOpts); err != nil {
				return nil, fmt.Errorf("idempotent: WithTxOptions: %w", err)
			}
		}
		o := cfg.txOpts
		m.run.txOpts = &o
	}
	if m.observer != nil {
		m.run.onRetry = m.observeRetry
	}
	if m.txidSQL != "" {
		m.run.beforeCommit = m.checkTxID
		m.run.afterFailure = m.checkTxIDAfterFailure
	}
	if err := checkSeen(cfg.seen, d); err != nil {
		return nil, err
	}
	if err := m.initRetention(cfg.retention); err != nil {
		return nil, err
	}
	if cfg.ordering != nil {
		if m.ord, err = newOrderer(d, table, cfg.ordering); err != nil {
			return nil, err
		}
	}
	if cfg.coalesce.Max > 0 {
		if m.co, err = newCoalescer(m, cfg.coalesce, m.run); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe runs f and tells the observer, if any, how it ended. f runs with
// the context of the delivery (see Starter).
func (m *Middleware) observe(ctx context.Context, key string, f func(ctx context.Context) (Outcome, int, error)) (Outcome, error) {
	if m.observer == nil {
		outcome, _, err := f(ctx)
		return outcome, err
	}
	ctx = m.startDelivery(ctx, key)
	start := time.Now()
	outcome, attempts, err := f(ctx)
	m.observer.Outcome(ctx, Event{
		Consumer: m.consumer, Key: key, Outcome: outcome, Attempts: attempts,
		Duration: time.Since(start), Err: err,
	})
	return outcome, err
}

// claimKey claims one key on tx through claimWith: with the horizon folded
// into the claim statement where the dialect can (dialect.HorizonClaimer)
// and the message has an event time — no horizon refuses a message without
// one, and the plain claim is cheaper for the server — else the plain
// claim. The horizon is read in tx only where it decides: after a fenced
// claim that inserted nothing (a duplicate, or refused: the horizon only
// rises, so a read now that does not refuse the message shows the statement
// did not either), or after a new claim on a dialect that cannot fence in
// the statement.
func (m *Middleware) claimKey(ctx context.Context, tx *sql.Tx, st *attemptState, key string, at time.Time) (bool, error) {
	return m.claimKeyFenced(ctx, tx, st, key, at, nil)
}

// claimKeyFenced is claimKey with the claim statements of a coalesced
// group's fence, f, when not nil (see coalescer.passFenced): the same
// statement, which also fails unless it runs in the transaction f's token
// marked.
func (m *Middleware) claimKeyFenced(ctx context.Context, tx *sql.Tx, st *attemptState, key string, at time.Time, f *txFence) (bool, error) {
	snap, cached, err := m.leasedHorizon(key, at)
	if err != nil {
		return false, err
	}
	return m.claimWith(ctx, tx, st, func() (bool, error) {
		fenced := m.hclaimSQL != "" && !at.IsZero() && !cached
		q, args := m.claimSQL, make([]any, 0, 5)
		if f != nil {
			q = f.claimSQL
		}
		args = append(args, m.consumerArg, key)
		if m.ret.part != nil {
			args = append(args, eventDay(at).Format(time.DateOnly))
		}
		if fenced {
			q, args = m.hclaimSQL, append(args, m.ret.fence(at))
			if f != nil {
				q = f.hclaimSQL
			}
		}
		if f != nil {
			args = append(args, f.token)
		}
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			if rerr := m.retentionClaimError(ctx, tx, err, nil, at); rerr != nil {
				return false, rerr
			}
			return false, m.claimError(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, fmt.Errorf("idempotent: claim: rows affected: %w", err)
		}
		if (fenced && n == 0) || (!fenced && n == 1 && m.hk != nil && !at.IsZero() && !(cached && m.lease.Fresh(snap))) {
			if _, err := m.checkHorizonAfterClaim(ctx, tx, []string{key}, []time.Time{at}); err != nil {
				return false, err
			}
		}
		return n == 1, nil
	})
}

// claimWith is the one claim path: every entry point that claims (the
// single-message path processMessage, the batch path processMessages and
// claimMessage for a caller's transaction) claims through it, so what surrounds
// the claim statement cannot differ between them. stmt runs the claim
// statement (or statements) and reports whether anything was claimed;
// claimWith runs it under the lock timeout (withLockTimeout) and then, when
// st is not nil — the middleware owns tx and runs a handler in it — and stmt
// claimed, takes the strict guard's first reading (captureTxID).
func (m *Middleware) claimWith(ctx context.Context, tx *sql.Tx, st *attemptState, stmt func() (bool, error)) (bool, error) {
	claimed, err := m.withLockTimeout(ctx, tx, stmt)
	if err != nil || !claimed || st == nil {
		return claimed, err
	}
	return true, m.captureTxID(ctx, tx, st)
}

// withLockTimeout runs stmt on tx after setting the lock timeout of
// WithLockTimeout, if any, and restores the session's own setting afterwards
// where the dialect needs it (dialect.LockTimeoutResetter) — whether stmt
// succeeded, failed or panicked, and even when ctx has ended: the setting
// must not stay on a pooled connection, nor bound the handler's own waits.
// Only claimWith calls it.
func (m *Middleware) withLockTimeout(ctx context.Context, tx *sql.Tx, stmt func() (bool, error)) (claimed bool, err error) {
	if m.lockSQL != "" {
		if _, err := tx.ExecContext(ctx, m.lockSQL); err != nil {
			return false, fmt.Errorf("idempotent: set lock timeout: %w", err)
		}
		if m.lockReset != "" {
			defer func() {
				if _, rerr := tx.ExecContext(withoutToken(context.WithoutCancel(ctx)), m.lockReset); rerr != nil && err == nil {
					claimed, err = false, fmt.Errorf("idempotent: reset lock timeout: %w", rerr)
				}
			}()
		}
	}
	return stmt()
}

// claimError wraps a failed claim statement's error for claim and the
// batch claim (Config.ClaimError).
func (m *Middleware) claimError(err error) error { return m.Config().ClaimError(err) }

// captureTxID is the strict guard's first read: with WithStrictGuard, every
// path that runs a handler and commits reads the transaction id before the
// handler runs (claimWith after a claim, ProcessNatural without one), and
// checkTxID reads it again before COMMIT.
func (m *Middleware) captureTxID(ctx context.Context, tx *sql.Tx, st *attemptState) error {
	if m.txidSQL == "" {
		return nil
	}
	if err := tx.QueryRowContext(ctx, m.txidSQL).Scan(&st.txid); err != nil {
		return fmt.Errorf("idempotent: strict guard: read transaction id: %w", err)
	}
	if st.txid == "" {
		return fmt.Errorf("idempotent: strict guard: the %s dialect's transaction id query returned nothing", m.d.Name())
	}
	return nil
}

// probeTxID runs the strict guard's query once, from EnsureSchema, so that
// WithStrictGuard on a server that cannot answer it (MySQL proper has no
// @@in_transaction) fails there rather than at every applied message.
func (m *Middleware) probeTxID(ctx context.Context, tx *sql.Tx) error {
	var id sql.NullString
	if err := tx.QueryRowContext(ctx, m.txidSQL).Scan(&id); err != nil {
		if m.d.Classify(err).Retryable() {
			return err
		}
		return fmt.Errorf("idempotent: WithStrictGuard: this server cannot run the %s dialect's transaction id query %q (MySQL has no @@in_transaction: the strict guard needs MariaDB there): %w", m.d.Name(), m.txidSQL, err)
	}
	if id.String == "" {
		return fmt.Errorf("idempotent: WithStrictGuard: the %s dialect's transaction id query %q returned nothing on this server", m.d.Name(), m.txidSQL)
	}
	return nil
}

// checkTxIDAfterFailure is the strict guard on the error path: after the
// handler failed, the transaction id read by captureTxID must still be
// current, or the claim was committed behind the middleware's back — by a
// statement the database commits implicitly (DDL, LOCK TABLES, … on MySQL
// and MariaDB) or the handler's own COMMIT — and the rollback that follows
// cannot undo it. Nothing can be done automatically: deleting the claim
// would let a redelivery apply again the part of the effect that did
// commit. The error says so and matches ErrAutocommit, which adapters treat
// as a failure, never as a retry. A failure to read the id (a lost
// connection, a cancelled context) proves nothing and is ignored.
func (m *Middleware) checkTxIDAfterFailure(ctx context.Context, tx *sql.Tx, st *attemptState) error {
	if st.txid == "" {
		return nil // the handler never ran
	}
	var now string
	if err := tx.QueryRowContext(ctx, m.txidSQL).Scan(&now); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
			return fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit)
		}
		return nil
	}
	if now == st.txid {
		return nil
	}
	return fmt.Errorf("%w: CLAIM COMMITTED WITHOUT ITS FULL EFFECT: the session left the claim's transaction (id %s, now %s) before the handler failed — "+
		"a statement the database commits implicitly (DDL, LOCK TABLES, …) or a COMMIT ran through the transaction, so the claim and the effect up to it are committed, "+
		"and the statements after it committed one by one; redeliveries will be Duplicate: repair the effect by hand", ErrAutocommit, st.txid, now)
}

// checkTxID is the strict guard: the transaction id read by captureTxID must
// still be current.
func (m *Middleware) checkTxID(ctx context.Context, tx *sql.Tx, st *attemptState) error {
	var now string
	if err := tx.QueryRowContext(ctx, m.txidSQL).Scan(&now); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return fmt.Errorf("%w: the handler committed or rolled back the transaction itself", ErrAutocommit)
		}
		return fmt.Errorf("idempotent: strict guard: read transaction id: %w", err)
	}
	if now != st.txid {
		return fmt.Errorf("%w: the session left the claim's transaction (id %s, now %s): an explicit COMMIT in the handler, or a pooler that moved the session", ErrAutocommit, st.txid, now)
	}
	return nil
}

func (m *Middleware) observeRetry(ctx context.Context, key string, attempt int, class dialect.Class, err error, backoff time.Duration) {
	m.observer.Retry(ctx, RetryEvent{
		Consumer: m.consumer, Key: key, Attempt: attempt, Reason: class.Kind.String(),
		Code: class.Code, Err: err, Backoff: backoff,
	})
}

// keyFailed reports the failure of a wrapper's message function
// (WrapMessage, WrapMessageTx) to the observer and returns it as an error
// matching ErrInvalidKey.
func (m *Middleware) keyFailed(ctx context.Context, err error) error {
	err = fmt.Errorf("%w: key function: %w", ErrInvalidKey, err)
	if m.observer != nil {
		m.observer.Outcome(ctx, Event{Consumer: m.consumer, Err: err})
	}
	return err
}
