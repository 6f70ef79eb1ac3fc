package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// Outcome is how a delivery ended when it did not fail.
type Outcome int

const (
	// Applied means the claim was new: the handler ran and its effect
	// committed together with the claim.
	Applied Outcome = iota + 1
	// Duplicate means the claim already existed: the message was applied
	// before (or by a concurrent delivery), and the handler did not run.
	Duplicate
)

// String returns "applied" or "duplicate".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
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
	lockSQL     string
	lockReset   string
	txidSQL     string
	lockTimeout time.Duration
	maxKey      int
	observer    Observer
	run         runner
	ret         retention
	seen        Seen
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
	m.run = runner{db: db, d: d, policy: cfg.retry}
	if cfg.txOpts != (sql.TxOptions{}) {
		o := cfg.txOpts
		m.run.txOpts = &o
	}
	if m.observer != nil {
		m.run.onRetry = m.observeRetry
	}
	if m.txidSQL != "" {
		m.run.beforeCommit = m.checkTxID
	}
	if err := m.initRetention(cfg.retention); err != nil {
		return nil, err
	}
	return m, nil
}

// Consumer returns the consumer name given to New.
func (m *Middleware) Consumer() string { return m.consumer }

// Table returns the claim table's name as configured, unquoted.
func (m *Middleware) Table() string { return m.table.String() }

// Dialect returns the dialect given to New.
func (m *Middleware) Dialect() dialect.Dialect { return m.d }

// EnsureSchema creates the claim table and its processed_at index if they do
// not exist (the guide's Step 1). It is safe to call from many processes at
// once and on every start. In partitioned mode (WithDailyPartitions) it
// creates the partitioned table and the partitions MaintainPartitions would
// create, but drops none. It fails, naming the table, when an existing table
// is partitioned and the Middleware is not, or the other way round.
//
// If the dialect implements dialect.ServerChecker, EnsureSchema first checks
// that the database is one the dialect speaks: a dialect used with another
// database's driver fails here with an error matching
// dialect.ErrWrongDatabase.
func (m *Middleware) EnsureSchema(ctx context.Context) error {
	stmts := m.schemaSQL()
	checker, _ := m.d.(dialect.ServerChecker)
	err := RunTx(ctx, m.db, m.d, nil, m.run.policy, func(ctx context.Context, tx *sql.Tx) error {
		if checker != nil {
			if err := checker.CheckServer(ctx, m.table, txQuery(tx)); err != nil {
				return err
			}
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idempotent: ensure schema of %s: %w", m.table, err)
	}
	return m.afterSchema(ctx)
}

// txQuery returns a dialect.QueryFunc that runs on tx.
func txQuery(tx *sql.Tx) dialect.QueryFunc {
	return func(ctx context.Context, query string, args ...any) (string, error) {
		var s sql.NullString
		err := tx.QueryRowContext(ctx, query, args...).Scan(&s)
		return s.String, err
	}
}

// Process applies fn's effect for the message with the given key exactly
// once for this consumer.
//
// It begins a transaction, inserts the claim (consumer, key), and, only if
// the claim is new, runs fn in the same transaction and commits both
// together: the result is Applied. If the claim exists, fn does not run and
// the result is Duplicate. A concurrent delivery of the same key waits for
// the first to finish; if that one rolls back, the waiting one applies.
//
// An error from fn rolls back claim and effect together and is returned
// wrapped. Serialization failures, deadlocks and lost connections — even
// during COMMIT, where the outcome is unknown — are retried from the start
// under the retry policy: if a lost COMMIT did land, the retry finds the
// claim and returns Duplicate. A panic in fn rolls back and re-panics.
//
// fn must do all its work through tx, with ctx; see GuardConnector for how
// a mistake is caught. Ack the message only after Process returns without an
// error (Applied and Duplicate alike).
func (m *Middleware) Process(ctx context.Context, key string, fn TxFunc) (Outcome, error) {
	return m.processAt(ctx, key, time.Time{}, fn)
}

// processAt is Process with the message's event time (zero when it has none).
func (m *Middleware) processAt(ctx context.Context, key string, at time.Time, fn TxFunc) (Outcome, error) {
	return m.observe(ctx, key, func() (Outcome, int, error) { return m.process(ctx, &m.run, key, at, fn) })
}

// observe runs f and tells the observer, if any, how it ended.
func (m *Middleware) observe(ctx context.Context, key string, f func() (Outcome, int, error)) (Outcome, error) {
	if m.observer == nil {
		outcome, _, err := f()
		return outcome, err
	}
	start := time.Now()
	outcome, attempts, err := f()
	m.observer.Outcome(ctx, Event{
		Consumer: m.consumer, Key: key, Outcome: outcome, Attempts: attempts,
		Duration: time.Since(start), Err: err,
	})
	return outcome, err
}

func (m *Middleware) process(ctx context.Context, r *runner, key string, at time.Time, fn TxFunc) (Outcome, int, error) {
	if fn == nil {
		return 0, 0, errors.New("idempotent: Process: nil function")
	}
	if err := validateKey(key, m.maxKey); err != nil {
		return 0, 0, err
	}
	if err := m.checkEvent(key, at); err != nil {
		return 0, 0, err
	}
	if m.seenBefore(ctx, key) {
		return Duplicate, 0, nil
	}
	var outcome Outcome
	attempts, err := r.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		claimed, err := m.claim(ctx, tx, key, at)
		if err != nil {
			return err
		}
		if !claimed {
			outcome = Duplicate
			st.skipCommit = true
			return nil
		}
		outcome = Applied
		if err := m.captureTxID(ctx, tx, st); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
	if err != nil {
		return 0, attempts, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	m.recordSeen(ctx, key)
	return outcome, attempts, nil
}

// Claim inserts the claim for key in a transaction the caller owns, and
// reports whether it was new. When it was, the caller applies the effect in
// tx and commits; when not, the message is a duplicate. Claim neither
// commits nor retries: the caller does both. The lock timeout, if set,
// applies to tx from here on.
func (m *Middleware) Claim(ctx context.Context, tx *sql.Tx, key string) (claimed bool, err error) {
	if tx == nil {
		return false, errors.New("idempotent: Claim: nil transaction")
	}
	if err := validateKey(key, m.maxKey); err != nil {
		return false, err
	}
	if err := m.checkEvent(key, time.Time{}); err != nil {
		return false, err
	}
	claimed, err = m.claim(ctx, tx, key, time.Time{})
	if err != nil {
		return false, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	return claimed, nil
}

// claim runs the lock timeout (if any) and the claim statement on tx, then
// the dialect's lock timeout reset (if any).
func (m *Middleware) claim(ctx context.Context, tx *sql.Tx, key string, at time.Time) (claimed bool, err error) {
	if m.lockSQL != "" {
		if _, err := tx.ExecContext(ctx, m.lockSQL); err != nil {
			return false, fmt.Errorf("idempotent: set lock timeout: %w", err)
		}
		if m.lockReset != "" {
			defer func() {
				// Even when ctx has ended: the setting must not stay on a
				// pooled connection.
				if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), m.lockReset); rerr != nil && err == nil {
					claimed, err = false, fmt.Errorf("idempotent: reset lock timeout: %w", rerr)
				}
			}()
		}
	}
	var res sql.Result
	if m.ret.part == nil {
		res, err = tx.ExecContext(ctx, m.claimSQL, m.consumerArg, key)
	} else {
		res, err = tx.ExecContext(ctx, m.claimSQL, m.consumerArg, key, eventDay(at).Format(time.DateOnly))
	}
	if err != nil {
		if rerr := m.retentionClaimError(err, at); rerr != nil {
			return false, rerr
		}
		return false, m.claimError(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idempotent: claim: rows affected: %w", err)
	}
	return n == 1, nil
}

// claimError wraps a failed claim statement's error for claim and the batch claim.
func (m *Middleware) claimError(err error) error {
	switch m.d.Classify(err).Kind {
	case dialect.KindLockTimeout:
		if m.lockTimeout == 0 {
			// The database's own lock timeout, not WithLockTimeout's.
			return fmt.Errorf("%w: %w", ErrClaimBusy, err)
		}
		return fmt.Errorf("%w (lock timeout %v): %w", ErrClaimBusy, m.lockTimeout, err)
	case dialect.KindUndefinedTable:
		return fmt.Errorf("%w: %s: %w", ErrNoClaimTable, m.table, err)
	}
	return fmt.Errorf("idempotent: claim: %w", err)
}

// captureTxID is the strict guard's first read: with WithStrictGuard, every
// path that runs a handler and commits reads the transaction id before the
// handler runs, and checkTxID reads it again before COMMIT.
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

// keyFailed reports a Wrap key function's failure to the observer and
// returns it as an error matching ErrInvalidKey.
func (m *Middleware) keyFailed(ctx context.Context, err error) error {
	err = fmt.Errorf("%w: key function: %w", ErrInvalidKey, err)
	if m.observer != nil {
		m.observer.Outcome(ctx, Event{Consumer: m.consumer, Err: err})
	}
	return err
}

// Wrap turns a handler of decoded messages into a function that processes
// each message exactly once. key returns the message's stable,
// producer-assigned identity — an event id or a natural key such as
// "order-completed:9912", never a broker's delivery tag or a message id the
// broker reassigns on republish. If key fails, the returned function
// returns an error matching ErrInvalidKey without opening a transaction.
func Wrap[M any](m *Middleware, key func(M) (string, error), h Handler[M]) func(ctx context.Context, msg M) (Outcome, error) {
	return func(ctx context.Context, msg M) (Outcome, error) {
		if key == nil || h == nil {
			return 0, errors.New("idempotent: Wrap: nil key function or handler")
		}
		k, err := key(msg)
		if err != nil {
			return 0, m.keyFailed(ctx, err)
		}
		return m.Process(ctx, k, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, msg) })
	}
}
