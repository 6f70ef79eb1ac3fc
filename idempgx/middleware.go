package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/horizonlease"
	"github.com/txclaim/idempotent/postgres"
)

// Func is a message's effect, run inside the claim's transaction. It must do
// all its database work through tx (or code built on it, such as sqlc's
// Queries.WithTx(tx)), with ctx, and must not commit or roll back tx.
type Func func(ctx context.Context, tx pgx.Tx) error

// Handler applies one decoded message's effect inside the claim's
// transaction.
type Handler[M any] func(ctx context.Context, tx pgx.Tx, msg M) error

// ErrNested reports ProcessMessage (or ProcessMessages, or a wrapper built
// on them) called with a context that a Middleware of this package handed to a handler: the inner
// call would take another connection from the pool and commit its claim and
// effect on its own, outside the outer claim's transaction, which is the
// mistake the core calls ErrAutocommit. errors.Is(err,
// idempotent.ErrAutocommit) holds for it. Nothing was sent to the database.
// To apply several effects exactly once together, do them in one handler.
var ErrNested = fmt.Errorf("%w: ProcessMessage called from inside a handler", idempotent.ErrAutocommit)

// Middleware applies message effects exactly once for one consumer, on a
// pgxpool.Pool. It is safe for concurrent use; create one per consumer and
// share it.
type Middleware struct {
	pool     *pgxpool.Pool // New's; nil in unit tests that replace acquire
	acquire  func(ctx context.Context) (lease, error)
	core     *idempotent.Middleware
	consumer string
	claimSQL string // a plain table's claim of a message without an event time
	// strictSQL is claimSQL made to fail when it inserts nothing, for the
	// single path's one round trip (oneTrip) under WithQueuedOnly; "" when
	// not.
	strictSQL   string
	fencedSQL   string // the claim of a message with one, the horizon folded in (HorizonClaimQuerySQL)
	batchSQL    string
	batchAtSQL  string              // the batch claim with event days, partitioned mode
	horizonSQL  string              // the consumer's horizon (HorizonSQL), read after a batch claim
	lease       *horizonlease.Cache // WithHorizonLease's cached horizon, plain tables; nil reads it in every claim
	horizonArgs []any
	txOpts      pgx.TxOptions
	beginStmt   string // BEGIN with the isolation level
	beginName   string // prepared statement names
	lockName    string
	claimName   string
	fencedName  string
	lockSQL     string
	lockTimeout time.Duration
	cfg         idempotent.Config // Config(), for the core's claim-error mapping
	table       string
	policy      idempotent.RetryPolicy
	observer    idempotent.Observer
	seen        idempotent.Seen
	seenBatch   idempotent.SeenBatch // SeenBatchOf(seen), for batches
	queuedOnly  bool                 // WithQueuedOnly
	retention   time.Duration
	skew        time.Duration // the clock-skew margin, for the horizon's fence
	partitioned bool
	prepared    bool // the pool's connections prepare statements
	leadDays    int
	co          *coalescer // nil without WithCoalescing
	pg          *postgres.Dialect
	ord         *orderer         // nil without WithOrdering
	clock       func() time.Time // WithClock
	// status reads the claim connection's transaction status and whether it
	// is closed; unit tests replace it.
	status func(l *lease) (txStatus byte, closed bool)
}

// New returns a Middleware that records claims for consumer in the claim
// table, on pool. consumer follows the rules of idempotent.New (1 to 128
// bytes of ASCII letters, digits and . _ - : /, starting with a letter or
// digit); bad options and names are errors matching the core's
// (idempotent.ErrInvalidConsumer, for one).
//
// New sends nothing to the database; call EnsureSchema (or run the
// migration) before the first message.
func New(pool *pgxpool.Pool, consumer string, opts ...Option) (*Middleware, error) {
	if pool == nil {
		return nil, errors.New("idempgx: New: nil *pgxpool.Pool")
	}
	m, err := newMiddleware(stdlib.OpenDBFromPool(pool), consumer, opts)
	if err != nil {
		return nil, err
	}
	m.pool = pool
	m.prepared = usesPrepared(pool.Config().ConnConfig.DefaultQueryExecMode)
	m.acquire = func(ctx context.Context) (lease, error) {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			return lease{}, err
		}
		c := pc.Conn()
		return lease{c: c, raw: c, pc: pc}, nil
	}
	return m, nil
}

func newMiddleware(db *sql.DB, consumer string, opts []Option) (*Middleware, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idempgx: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	pg := postgres.New()
	// The database/sql Middleware on the same pool validates the consumer,
	// the table and the retention settings exactly as the core does, and
	// runs the schema, cleanup and partition upkeep.
	core, err := idempotent.New(db, pg, consumer, cfg.core()...)
	if err != nil {
		return nil, err
	}
	table, err := dialect.ParseTable(cfg.table)
	if err != nil {
		return nil, fmt.Errorf("idempgx: %w", err)
	}
	horizonSQL, horizonArgs := pg.HorizonSQL(table, consumer)
	m := &Middleware{
		core:        core,
		consumer:    consumer,
		claimSQL:    pg.ClaimSQL(table),
		fencedSQL:   pg.HorizonClaimQuerySQL(table, false),
		batchSQL:    pg.BatchClaimSQL(table),
		batchAtSQL:  pg.PartitionedBatchClaimSQL(table),
		horizonSQL:  horizonSQL,
		horizonArgs: horizonArgs,
		lockTimeout: cfg.lockTimeout,
		table:       core.Config().Table,
		policy:      cfg.retry,
		observer:    cfg.observer,
		seen:        cfg.seen,
		seenBatch:   idempotent.SeenBatchOf(cfg.seen),
		queuedOnly:  cfg.queuedOnly,
		retention:   cfg.retention,
		skew:        cfg.skew,
		leadDays:    cfg.leadDays,
		pg:          pg,
		clock:       cfg.clock,
		status:      connStatus,
	}
	if cfg.iso != "" {
		m.txOpts.IsoLevel = cfg.iso
	}
	if cfg.ordering != nil {
		m.ord = newOrderer(pg, table, cfg.ordering)
	}
	if cfg.lockTimeout > 0 {
		m.lockSQL = pg.LockTimeoutSQL(cfg.lockTimeout)
	}
	if cfg.leadDays > 0 {
		m.partitioned = true
		m.claimSQL = "" // every message has an event time
		m.fencedSQL = pg.HorizonClaimQuerySQL(table, true)
	}
	if cfg.lease > 0 && !m.partitioned {
		m.initLease(db, pg, table, cfg.lease)
	}
	if cfg.queuedOnly && m.claimSQL != "" {
		m.strictSQL = strictClaim(m.claimSQL)
	}
	m.beginStmt = "begin"
	if cfg.iso != "" {
		m.beginStmt = "begin isolation level " + string(cfg.iso)
	}
	m.cfg = m.Config()
	if cfg.coalescing {
		m.co = newCoalescer(m, cfg.coalesce, table)
	}
	m.beginName = statementName("begin", m.beginStmt)
	m.lockName = statementName("lock", m.lockSQL)
	m.claimName = statementName("claim", m.claimSQL)
	m.fencedName = statementName("fenced", m.fencedSQL)
	return m, nil
}

// Config returns what the Middleware was configured with, as
// idempotent.Middleware.Config does: its consumer, the Postgres dialect,
// the claim table, the retention settings and the lock timeout. StrictGuard
// is always false: this path has no strict guard.
func (m *Middleware) Config() idempotent.Config {
	cfg := m.core.Config()
	cfg.LockTimeout = m.lockTimeout
	return cfg
}

// Core returns the database/sql Middleware for the same consumer, claim
// table and retention settings, running on the same pool through pgx's
// stdlib adapter. Use its ClaimTable for the upkeep this package does not
// repeat: Cleanup, MaintainPartitions, Partitions. Its claims and this Middleware's
// are the same rows, so the two can serve one consumer side by side.
func (m *Middleware) Core() *idempotent.Middleware { return m.core }

// Pool returns the pool the Middleware was created on, on which it claims.
// A package built on the Middleware reads its own tables there (pgxhttp
// reads stored responses through it) without a pool of its own.
func (m *Middleware) Pool() *pgxpool.Pool { return m.pool }

// EnsureSchema creates the claim table and its index if they do not exist,
// as idempotent.Middleware.EnsureSchema does (in partitioned mode, with its
// partitions).
func (m *Middleware) EnsureSchema(ctx context.Context) error { return m.core.EnsureSchema(ctx) }

// ProcessMessage applies fn's effect for msg exactly once for this
// consumer, with the semantics of idempotent.Middleware.ProcessMessage.
//
// It takes a connection from the pool and sends BEGIN (with the isolation
// level and lock timeout, if set) and the claim's INSERT … ON CONFLICT DO
// NOTHING in one round trip. Only if the claim inserted does fn run, in the
// same transaction, which is then committed: the result is
// idempotent.Applied. If the claim existed, the transaction is rolled back
// and the result is idempotent.Duplicate: a duplicate costs two round trips
// (the pipelined BEGIN and claim, then ROLLBACK). A new message's claim is
// never committed without its effect: BEGIN travels first in the pipeline.
//
// When msg.EventTime is set, a message older than the retention window is
// refused with an error matching idempotent.ErrBeyondRetention, one later
// than the clock plus the clock-skew margin with
// idempotent.ErrInvalidEventTime, before anything is sent; in partitioned
// mode the event time is required and chooses the claim's partition, and a
// day without its partition yet fails with idempotent.ErrNoPartition, which
// is transient. The claim table's retention horizon fences it too, in the
// claim statement itself (the same round trip): a message older than what a
// cleanup or a partition drop has already forgotten is refused with
// idempotent.ErrBeyondRetention whatever this Middleware's window, and so is
// a day without its partition that the table dropped.
//
// An error from fn rolls back claim and effect together and is returned
// wrapped, at once, unless it is a serialization failure (40001) or a
// deadlock (40P01) that failed the claim's own transaction, or the loss of
// the claim's own connection: those, and the same failures of BEGIN, the
// claim or COMMIT, are retried from the start under the retry policy, on a
// fresh connection. A 40001 from a statement the handler ran elsewhere (on
// the pool) is the handler's own error and is not retried, and neither is
// context.Canceled or context.DeadlineExceeded. A panic in fn rolls back and
// re-panics.
//
// tx is only valid until fn returns. Its Commit and Rollback refuse (the
// middleware commits), recording an error matching idempotent.ErrAutocommit
// that fails the delivery; a COMMIT or ROLLBACK statement run through it is
// caught the same way, as the connection is then no longer in a transaction.
// Its Begin opens a savepoint. A handler that returns with a query's rows
// or a batch's results open fails, and is not retried: the connection is
// still busy with them, so nothing of the attempt can commit.
// ProcessMessage called with fn's ctx fails with ErrNested.
//
// A message with an ordering key and sequence (msg.OrderKey, msg.OrderSeq)
// is applied in its entity's order on a Middleware created WithOrdering
// (the outcome may then be idempotent.Parked: ack it); on one created
// without, it fails with an error matching idempotent.ErrInvalidOrder, and
// nothing is written.
//
// Under WithCoalescing, concurrent calls share transactions: see there.
func (m *Middleware) ProcessMessage(ctx context.Context, msg idempotent.Message, fn Func) (idempotent.Outcome, error) {
	if msg.OrderKey != "" || msg.OrderSeq != 0 {
		if m.ord == nil {
			// The core refuses it, for it was not created WithOrdering
			// either. Applying it unchecked would apply it out of
			// order, silently.
			err := m.core.CheckMessage(msg)
			if err == nil {
				err = fmt.Errorf("%w: key %q: the Middleware was not created WithOrdering", idempotent.ErrInvalidOrder, msg.Key)
			}
			m.observe(ctx, msg.Key, 0, 0, time.Time{}, err)
			return 0, err
		}
		var start time.Time
		if m.observer != nil {
			start = time.Now()
		}
		outcome, attempts, err := m.processOrdered(ctx, msg, fn)
		m.observe(ctx, msg.Key, outcome, attempts, start, err)
		return outcome, err
	}
	return m.processAt(ctx, msg.Key, msg.EventTime, fn)
}

func (m *Middleware) processAt(ctx context.Context, key string, at time.Time, fn Func) (idempotent.Outcome, error) {
	var start time.Time
	if m.observer != nil {
		start = time.Now()
	}
	outcome, attempts, err := m.process(ctx, key, at, fn)
	m.observe(ctx, key, outcome, attempts, start, err)
	return outcome, err
}

func (m *Middleware) observe(ctx context.Context, key string, o idempotent.Outcome, attempts int, start time.Time, err error) {
	if m.observer == nil {
		return
	}
	e := idempotent.Event{Consumer: m.consumer, Key: key, Outcome: o, Attempts: attempts, Err: err}
	if !start.IsZero() {
		e.Duration = time.Since(start)
	}
	m.observer.Outcome(ctx, e)
}

func (m *Middleware) process(ctx context.Context, key string, at time.Time, fn Func) (idempotent.Outcome, int, error) {
	if fn == nil {
		return 0, 0, errors.New("idempgx: ProcessMessage: nil function")
	}
	if ctx.Value(claimKey{}) != nil {
		return 0, 0, fmt.Errorf("idempgx: consumer %q, key %q: %w", m.consumer, key, ErrNested)
	}
	if err := m.core.CheckMessage(idempotent.Message{Key: key, EventTime: at}); err != nil {
		return 0, 0, err
	}
	scope := m.preCheckScope(ctx)
	if m.seenBefore(ctx, scope, key) {
		return idempotent.Duplicate, 0, nil
	}
	if m.lease != nil && !at.IsZero() {
		// Outside the claim's transaction; a failure leaves the claim to
		// read the horizon itself.
		_ = m.lease.Refresh(ctx)
	}
	if m.co != nil {
		return m.co.process(ctx, key, at, fn, scope)
	}
	return m.claimAndRun(ctx, key, at, fn, scope)
}

// keyError wraps a message's failure as ProcessMessage returns it.
func (m *Middleware) keyError(key string, err error) error {
	return fmt.Errorf("idempgx: consumer %q, key %q: %w", m.consumer, key, err)
}

// claimAndRun claims the message in a transaction of its own and runs fn
// there under the retry policy: the single-message path after its checks,
// and what a coalesced call that finds itself alone runs. scope is the
// pre-check's (preCheckScope), in which a committed claim is recorded.
func (m *Middleware) claimAndRun(ctx context.Context, key string, at time.Time, fn Func, scope idempotent.SeenScope) (idempotent.Outcome, int, error) {
	var outcome idempotent.Outcome
	c := &claimOne{m: m, at: at, key: key}
	if m.partitioned {
		c.day = at.UTC().Format(time.DateOnly)
	}
	if err := c.useLease(); err != nil {
		return 0, 0, m.keyError(key, err)
	}
	if m.strictSQL != "" && at.IsZero() {
		done, fn2 := m.oneTrip(ctx, key, fn)
		if done {
			m.recordSeen(ctx, scope, key)
			return idempotent.Applied, 1, nil
		}
		fn = fn2
	}
	attempts, err := m.run(ctx, key, c, fn, &outcome)
	if err != nil {
		return 0, attempts, m.keyError(key, err)
	}
	m.recordSeen(ctx, scope, key)
	return outcome, attempts, nil
}

// claimError translates a failed claim statement's error into the core's
// error values, with the core's own mapping (idempotent.Config.ClaimError);
// at are the event times of the claim (several for a batch), in partitioned
// mode. A day without its partition is a *missingDay, which the attempt
// resolves after its rollback.
func (m *Middleware) claimError(err error, at ...time.Time) error {
	cerr := m.cfg.ClaimError(err, at...)
	if len(at) > 0 && errors.Is(cerr, idempotent.ErrNoPartition) {
		return &missingDay{err: cerr, cause: err, ats: at}
	}
	return cerr
}

// WrapMessage turns a handler of decoded messages into a function that
// processes each message exactly once with ProcessMessage, as
// idempotent.WrapMessage does: msg returns the message's key and, when it
// has one, its event time. If msg fails, the returned function returns an
// error matching idempotent.ErrInvalidKey without taking a connection.
func WrapMessage[M any](m *Middleware, msg func(M) (idempotent.Message, error), h Handler[M]) func(ctx context.Context, msg M) (idempotent.Outcome, error) {
	return func(ctx context.Context, v M) (idempotent.Outcome, error) {
		if msg == nil || h == nil {
			return 0, errors.New("idempgx: WrapMessage: nil message function or handler")
		}
		mm, err := msg(v)
		if err != nil {
			err = fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
			m.observe(ctx, "", 0, 0, time.Time{}, err)
			return 0, err
		}
		return m.ProcessMessage(ctx, mm, func(ctx context.Context, tx pgx.Tx) error { return h(ctx, tx, v) })
	}
}

// claimOne is the single-message claim step. A message with an event time
// is claimed by the statement that also reads the horizon (fencedSQL); one
// without, which no horizon refuses, by the plain claim (claimSQL), which
// costs the server less. In a coalesced group of the optimistic design
// (token set) it is the group's fenced claim instead (coalescer.claimSQL or
// claimAtSQL), followed, for a message with an event time, by the
// horizon's read.
type claimOne struct {
	m     *Middleware
	at    time.Time
	key   string
	day   string // the event day in partitioned mode
	token string // the group transaction's fence (dialect.TxFencer); "" outside one
	// strict: the group's claim fails when it inserts nothing, and the
	// horizon is not read after it (coalescer.oneTrip).
	strict bool
	w      wireMessages
	// cached: the message was fenced against snap, the horizon cached
	// under WithHorizonLease, and is claimed with the plain claim.
	cached bool
	snap   horizonlease.Snapshot
}

// fenced reports whether the message has an event time, and so is claimed
// by fencedSQL (always, in partitioned mode).
func (c *claimOne) fenced() bool { return !c.at.IsZero() && !c.cached }

// queue adds the claim to the pipelined batch.
func (c *claimOne) queue(b *pgx.Batch) {
	fence, _ := c.m.fence(c.at)
	switch {
	case c.token != "":
		c.m.co.queueClaim(b, c, fence)
	case !c.fenced():
		b.Queue(c.m.claimSQL, c.m.consumer, c.key)
	case c.day != "":
		b.Queue(c.m.fencedSQL, c.m.consumer, c.key, c.day, fence)
	default:
		b.Queue(c.m.fencedSQL, c.m.consumer, c.key, fence)
	}
}

// read reads the claim's result: whether it inserted, or the refusal of a
// message older than the horizon.
func (c *claimOne) read(br pgx.BatchResults) (bool, error) {
	n, h, err := c.result(br)
	if err != nil {
		return false, err
	}
	return c.m.horizonClaimed(c.key, c.at, n, h)
}

// result reads how many claims the statement inserted (0 or 1) and the
// horizon it read (nil: none, or not read); err is a failed statement's.
func (c *claimOne) result(br pgx.BatchResults) (n int64, h *int64, err error) {
	if c.token != "" {
		return c.m.co.readClaim(br, c)
	}
	if !c.fenced() {
		tag, err := br.Exec()
		if err != nil {
			return 0, nil, c.m.claimError(err, c.at)
		}
		return tag.RowsAffected(), nil, nil
	}
	if err := br.QueryRow().Scan(&n, &h); err != nil {
		return 0, nil, c.m.claimError(err, c.at)
	}
	return n, h, nil
}

// connStatus reads a pgx connection's transaction status.
func connStatus(l *lease) (byte, bool) {
	if l.raw == nil {
		return 'T', false
	}
	pc := l.raw.PgConn()
	return pc.TxStatus(), pc.IsClosed()
}
