package mocks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// Mock is a sqlmock.Sqlmock that also scripts the statements an
// idempotent.Middleware sends for a delivery. Its own expectations — the
// handler's effect — are set through the embedded Sqlmock as usual, between
// the Mock's helpers:
//
//	m.ExpectApplied(key)
//	m.ExpectExec(…).WithArgs(…).WillReturnResult(…)
//	m.ExpectCommit()
//
// Every SQL text comes from the dialect, for the table, consumer and options
// the Mock was made with.
type Mock struct {
	sqlmock.Sqlmock

	d        dialect.Dialect
	table    dialect.Table
	consumer string
	// claimSQL is the dialect's claim statement (an Exec); hclaimSQL, when
	// not "", the claim with the retention horizon folded in (a query,
	// dialect.HorizonClaimer), which the Middleware sends instead for one
	// message.
	claimSQL  string
	hclaimSQL string
	// hk is the dialect's dialect.HorizonKeeper, nil when it keeps no
	// retention horizon.
	hk        dialect.HorizonKeeper
	lockSQL   string
	lockReset string
	// groupCo is the WithCoalescing the Mock was made with (Max 0: none),
	// and groupWaitSQL the bound of its groups' lock waits
	// (Coalescing.LockWait), "" when there is none. In the optimistic
	// design on a dialect.TxFencer, fenceSQL marks a group's transaction
	// (with that bound), checkSQL checks it, and fclaimSQL and fhclaimSQL
	// are claimSQL and hclaimSQL fenced; fenceSQL is "" with savepoints.
	// joiner is the dialect's StatementJoiner with savepoints (nil
	// without, or on a dialect that joins no statements): a member's
	// RELEASE then rides with the next member's SAVEPOINT, and the group's
	// bound with the first. grp is the group's transaction being scripted
	// (ExpectGroupBegin).
	joiner                                    dialect.StatementJoiner
	groupCo                                   idempotent.Coalescing
	groupWaitSQL                              string
	fenceSQL, checkSQL, fclaimSQL, fhclaimSQL string
	grp                                       *group
	txidSQL                                   string
	schema                                    []string
	// part is the dialect's partitioner in partitioned mode
	// (WithDailyPartitions), nil otherwise.
	part  dialect.Partitioner
	fence fence
	// txid is the transaction id the strict guard's queries return for the
	// current attempt; each ExpectApplied takes a new one.
	txid int64
}

// An Option tells For how the Middleware under test was configured.
type Option interface {
	apply(*settings) error
}

type settings struct {
	table       string
	lockTimeout time.Duration
	strictGuard bool
	leadDays    int
	fence       fence
	coalescing  idempotent.Coalescing
}

// fence is the retention fence of ProcessMessage: the window, the clock-skew
// margin and the clock.
type fence struct {
	window time.Duration
	skew   time.Duration
	clock  func() time.Time
}

type optionFunc func(*settings) error

func (f optionFunc) apply(s *settings) error { return f(s) }

// WithTable matches idempotent.WithTable: the claim table, as "table" or
// "schema.table". Default is idempotent.DefaultTable.
func WithTable(name string) Option {
	return optionFunc(func(s *settings) error {
		s.table = name
		return nil
	})
}

// WithLockTimeout matches idempotent.WithLockTimeout: every claim is
// preceded by the dialect's lock timeout statement. Default is none.
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("WithLockTimeout: %v is not a positive duration", d)
		}
		s.lockTimeout = d
		return nil
	})
}

// WithCoalescing matches idempotent.WithCoalescing, for the group helpers
// (ExpectGroupBegin and the others): its design (Coalescing.Savepoints, or
// the dialect's fence) and the bound of its lock waits
// (Coalescing.LockWait) where the dialect sets one. Default is none.
func WithCoalescing(c idempotent.Coalescing) Option {
	return optionFunc(func(s *settings) error {
		if c.Max < 2 {
			return fmt.Errorf("WithCoalescing: Max is %d, want at least 2", c.Max)
		}
		s.coalescing = c
		return nil
	})
}

// WithStrictGuard matches idempotent.WithStrictGuard: an applied claim is
// followed by the dialect's transaction id query, and the commit preceded by
// it again, both returning the same id. Default is off.
func WithStrictGuard() Option {
	return optionFunc(func(s *settings) error {
		s.strictGuard = true
		return nil
	})
}

// WithRetention matches idempotent.WithRetention: the retention window the
// event-time helpers (ExpectAppliedAt and the others) check an event time
// against. Default is idempotent.DefaultRetention.
func WithRetention(d time.Duration) Option {
	return optionFunc(func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("WithRetention: %v is not a positive duration", d)
		}
		s.fence.window = d
		return nil
	})
}

// WithClockSkew matches idempotent.WithClockSkew. Default is
// idempotent.DefaultClockSkew.
func WithClockSkew(d time.Duration) Option {
	return optionFunc(func(s *settings) error {
		if d < 0 {
			return fmt.Errorf("WithClockSkew: %v is negative", d)
		}
		s.fence.skew = d
		return nil
	})
}

// WithClock matches idempotent.WithClock: the clock the event-time helpers
// read for the retention fence. Default is time.Now.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(s *settings) error {
		if now == nil {
			return errors.New("WithClock: nil clock")
		}
		s.fence.clock = now
		return nil
	})
}

// WithDailyPartitions matches idempotent.WithDailyPartitions: claims carry
// their event day, so they are scripted with the event-time helpers
// (ExpectAppliedAt, ExpectDuplicateAt, ExpectClaimErrorAt, ExpectClaimAt),
// and the helpers without an event time panic, as the Middleware refuses
// those deliveries before sending anything. The dialect must implement
// dialect.Partitioner. Default is a table that is not partitioned.
func WithDailyPartitions(leadDays int) Option {
	return optionFunc(func(s *settings) error {
		if leadDays < 1 {
			return fmt.Errorf("WithDailyPartitions: %d lead days, want at least 1", leadDays)
		}
		s.leadDays = leadDays
		return nil
	})
}

// For returns a Mock scripting, on mock, the statements of a Middleware
// created with dialect d, consumer and the matching options.
//
// For panics if mock or d is nil, an option is invalid or the dialect cannot
// do what an option asks — mistakes in the test itself, which New for the
// Middleware would reject the same way.
func For(mock sqlmock.Sqlmock, d dialect.Dialect, consumer string, opts ...Option) *Mock {
	m, err := newMock(mock, d, consumer, opts)
	if err != nil {
		panic("mocks: For: " + err.Error())
	}
	return m
}

// ForMiddleware is For with everything mw tells of its configuration
// (Middleware.Config): its dialect, consumer and table, its lock timeout,
// strict guard, retention window, clock-skew margin, clock and partitioned
// mode. opts are no longer needed; any given are applied after what mw
// tells, and override it.
func ForMiddleware(mock sqlmock.Sqlmock, mw *idempotent.Middleware, opts ...Option) *Mock {
	if mw == nil {
		panic("mocks: ForMiddleware: nil Middleware")
	}
	cfg := mw.Config()
	m, err := newMock(mock, cfg.Dialect, cfg.Consumer, append(configOptions(cfg), opts...))
	if err != nil {
		panic("mocks: ForMiddleware: " + err.Error())
	}
	return m
}

// configOptions returns the Options matching a Middleware's configuration.
func configOptions(cfg idempotent.Config) []Option {
	opts := []Option{
		WithTable(cfg.Table),
		WithRetention(cfg.Retention),
		WithClockSkew(cfg.ClockSkew),
		WithClock(cfg.Clock),
	}
	if cfg.LockTimeout > 0 {
		opts = append(opts, WithLockTimeout(cfg.LockTimeout))
	}
	if cfg.StrictGuard {
		opts = append(opts, WithStrictGuard())
	}
	if cfg.Coalescing.Max > 0 {
		opts = append(opts, WithCoalescing(cfg.Coalescing))
	}
	if cfg.Partitioned() {
		opts = append(opts, WithDailyPartitions(cfg.PartitionLeadDays))
	}
	return opts
}

func newMock(mock sqlmock.Sqlmock, d dialect.Dialect, consumer string, opts []Option) (*Mock, error) {
	if mock == nil {
		return nil, errors.New("nil sqlmock.Sqlmock")
	}
	if d == nil {
		return nil, errors.New("nil dialect")
	}
	s := settings{
		table: idempotent.DefaultTable,
		fence: fence{window: idempotent.DefaultRetention, skew: idempotent.DefaultClockSkew, clock: time.Now},
	}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("nil option")
		}
		if err := o.apply(&s); err != nil {
			return nil, err
		}
	}
	table, err := dialect.ParseTable(s.table)
	if err != nil {
		return nil, fmt.Errorf("WithTable: %w", err)
	}
	m := &Mock{
		Sqlmock:  mock,
		d:        d,
		table:    table,
		consumer: consumer,
		claimSQL: d.ClaimSQL(table),
		schema:   d.SchemaSQL(table),
		txid:     1000,
		fence:    s.fence,
	}
	if s.leadDays > 0 {
		p, ok := d.(dialect.Partitioner)
		if !ok {
			return nil, fmt.Errorf("WithDailyPartitions: the %s dialect does not support partitions", d.Name())
		}
		m.part = p
		m.claimSQL = p.ClaimAtSQL(table)
	}
	if hk, ok := d.(dialect.HorizonKeeper); ok {
		m.hk = hk
		for _, h := range hk.HorizonSchemaSQL(table) {
			if !slices.Contains(m.schema, h) {
				m.schema = append(m.schema[:len(m.schema):len(m.schema)], h)
			}
		}
		if hc, ok := d.(dialect.HorizonClaimer); ok {
			m.hclaimSQL = hc.HorizonClaimSQL(table, m.part != nil)
		}
	}
	if s.lockTimeout > 0 {
		if m.lockSQL = d.LockTimeoutSQL(s.lockTimeout); m.lockSQL == "" {
			return nil, fmt.Errorf("WithLockTimeout: the %s dialect cannot bound lock waits", d.Name())
		}
		if r, ok := d.(dialect.LockTimeoutResetter); ok {
			m.lockReset = r.LockTimeoutResetSQL()
		}
	}
	if c := s.coalescing; c.Max > 0 {
		m.groupCo = c
		w, err := c.LockWaitOn(d)
		if err != nil {
			return nil, err
		}
		if w > 0 {
			m.groupWaitSQL = d.LockTimeoutSQL(w)
		}
		if f, ok := d.(dialect.TxFencer); ok && !c.Savepoints {
			m.fenceSQL, m.checkSQL = f.TxFenceSQL(w), f.TxFenceCheckSQL()
			m.fclaimSQL = f.TxFencedClaimSQL(table, m.part != nil, false)
			if m.hclaimSQL != "" {
				m.fhclaimSQL = f.TxFencedClaimSQL(table, m.part != nil, true)
			}
		}
		if j, ok := d.(dialect.StatementJoiner); ok && m.fenceSQL == "" {
			m.joiner = j
		}
	}
	if s.strictGuard {
		if m.txidSQL = d.TxIDSQL(); m.txidSQL == "" {
			return nil, fmt.Errorf("WithStrictGuard: the %s dialect cannot identify transactions", d.Name())
		}
	}
	return m, nil
}

// ExpectClaim expects the claim statement for key — preceded by the lock
// timeout statement when WithLockTimeout was given, and followed by the
// dialect's lock timeout reset if it has one (dialect.LockTimeoutResetter,
// as MySQL's) — and returns the claim for the test to complete with one of
// its Will methods: WillReturnResult with sqlmock.NewResult(0, 1) when the
// claim inserts, (0, 0) when it exists, or WillReturnError. Use it for
// Middleware.ClaimMessage in a transaction of the caller's; for ProcessMessage,
// ExpectApplied, ExpectDuplicate and ExpectClaimError script the whole
// transaction. In partitioned mode these four panic: a message there needs
// its event time (ExpectClaimAt, ExpectAppliedAt, ExpectDuplicateAt,
// ExpectClaimErrorAt).
//
// The claim is the dialect's: with a dialect.HorizonClaimer (Postgres) the
// query that also reads the table's retention horizon, with the fence
// value last — NULL for a message without an event time, the event's UTC
// midnight in partitioned mode, the event time less the clock-skew margin
// otherwise — answering how many claims it inserted and no horizon;
// otherwise the dialect's claim statement.
func (m *Mock) ExpectClaim(key string) *Claim {
	m.notPartitioned("ExpectClaim", "ExpectClaimAt")
	return m.expectClaim(key, time.Time{})
}

// Claim is one claim statement of a message, which the test completes with
// exactly one of its Will methods. The statements the Middleware sends
// after the claim — the read of the retention horizon some answers call
// for, the lock timeout reset — are scripted by that call, so complete the
// claim before scripting what follows it.
type Claim struct {
	m   *Mock
	key string
	at  time.Time // zero: no event time
	// exec is the claim: the dialect's claim statement or, folded is set,
	// its claim with the horizon folded in (dialect.HorizonClaimer).
	exec   *sqlmock.ExpectedExec
	folded bool
	done   bool
}

// WillReturnResult completes the claim with what it did, as an Exec's
// result: RowsAffected 1 when the claim inserted, 0 when it existed
// (Middleware.ClaimMessage reports false), or RowsAffected's error
// (sqlmock.NewErrorResult), which fails the claim. What the Middleware reads
// of the retention horizon next is scripted too, answering none recorded:
// with a dialect.HorizonClaimer (Postgres), after a claim of a message with
// an event time that inserted nothing (to tell a duplicate from a refusal);
// with a dialect that keeps a horizon but does not read it in the claim,
// after one that inserted.
func (c *Claim) WillReturnResult(res driver.Result) {
	c.begin("WillReturnResult")
	n, err := res.RowsAffected()
	c.exec.WillReturnResult(res)
	switch {
	case err != nil:
	case n == 1:
		c.m.expectHorizonAfterClaim(c.at, nil)
	case c.folded:
		c.m.expectHorizon(nil)
	}
	c.m.expectLockReset()
}

// WillReturnError completes the claim with its statement failing with err.
// In partitioned mode, where the dialect keeps a horizon and err is its
// error for a day without a partition (with Postgres, &pq.Error{Code:
// "23514"}), the Middleware then reads the horizon to tell a dropped day
// (ErrBeyondRetention) from one not created yet (ErrNoPartition): the read
// is scripted answering none recorded, so the error matches
// idempotent.ErrNoPartition.
func (c *Claim) WillReturnError(err error) {
	c.begin("WillReturnError")
	c.exec.WillReturnError(err)
	if c.m.part != nil && c.m.hk != nil && c.m.part.IsNoPartition(err) {
		c.m.expectHorizon(nil)
	}
	c.m.expectLockReset()
}

// WillRefuse completes the claim of a message with an event time (made by
// ExpectClaimAt) as refused by the table's retention horizon, horizon: a
// cleanup or partition drop has forgotten claims as old as the message's,
// and the Middleware returns an error matching idempotent.ErrBeyondRetention.
// With a dialect.HorizonClaimer (Postgres) the claim inserts nothing and the
// read of the horizon that follows answers horizon; otherwise it inserts,
// and the read that follows answers horizon. It panics if horizon would not
// refuse the message — a claim without an event time, or one whose fence
// value (see ExpectClaim) is not before horizon — or the dialect keeps no
// horizon.
func (c *Claim) WillRefuse(horizon time.Time) {
	c.begin("WillRefuse")
	c.m.mustRefuse("WillRefuse", c.at, horizon)
	if c.folded {
		c.exec.WillReturnResult(sqlmock.NewResult(0, 0))
		c.m.expectHorizon(&horizon)
	} else {
		c.exec.WillReturnResult(sqlmock.NewResult(0, 1))
		c.m.expectHorizonAfterClaim(c.at, &horizon)
	}
	c.m.expectLockReset()
}

func (c *Claim) begin(method string) {
	if c.done {
		panic(fmt.Sprintf("mocks: Claim.%s: the claim of %q is already complete", method, c.key))
	}
	c.done = true
}

// micros is a horizon as the dialect returns it: microseconds since the
// Unix epoch, or NULL for none.
func micros(h *time.Time) driver.Value {
	if h == nil {
		return nil
	}
	return h.UnixMicro()
}

// expectClaim expects the claim of key with event time at (zero: none),
// for the returned Claim to complete.
func (m *Mock) expectClaim(key string, at time.Time) *Claim {
	m.expectLockTimeout()
	c := &Claim{m: m, key: key, at: at}
	args := []driver.Value{m.consumer, key}
	if m.part != nil {
		args = append(args, eventDay(at))
	}
	if m.hclaimSQL != "" && !at.IsZero() {
		// A message without an event time takes the plain claim: no
		// horizon can refuse it.
		c.exec = m.Sqlmock.ExpectExec(m.hclaimSQL).WithArgs(append(args, m.fenceValue(at))...)
		c.folded = true
	} else {
		c.exec = m.Sqlmock.ExpectExec(m.claimSQL).WithArgs(args...)
	}
	return c
}

// fenceValue is the value the Middleware compares the horizon with for a
// message with event time at: NULL for none, the event's UTC day in
// partitioned mode, the event time less the clock-skew margin otherwise.
func (m *Mock) fenceValue(at time.Time) driver.Value {
	if at.IsZero() {
		return nil
	}
	if m.part != nil {
		return dayOf(at)
	}
	return at.Add(-m.fence.skew).UTC()
}

// refuses reports whether horizon refuses a message with event time at, as
// the Middleware decides.
func (m *Mock) refuses(at, horizon time.Time) bool {
	f, ok := m.fenceValue(at).(time.Time)
	return ok && horizon.After(f)
}

// mustRefuse panics unless the dialect keeps a horizon and horizon refuses
// a message with event time at.
func (m *Mock) mustRefuse(helper string, at, horizon time.Time) {
	switch {
	case m.hk == nil:
		panic(fmt.Sprintf("mocks: %s: the %s dialect keeps no retention horizon", helper, m.d.Name()))
	case at.IsZero():
		panic(fmt.Sprintf("mocks: %s: a message without an event time is never refused by the horizon", helper))
	case !m.refuses(at, horizon):
		panic(fmt.Sprintf("mocks: %s: event time %s is not older than the horizon %s: the Middleware would claim it",
			helper, at.UTC().Format(time.RFC3339), horizon.UTC().Format(time.RFC3339)))
	}
}

// expectHorizonAfterClaim expects, where the dialect keeps a horizon but
// does not read it in the claim, the read of the horizon that follows a new
// claim of a message with event time at (none without one), answering h.
func (m *Mock) expectHorizonAfterClaim(at time.Time, h *time.Time) {
	if m.hk != nil && m.hclaimSQL == "" && !at.IsZero() {
		m.expectHorizon(h)
	}
}

// expectHorizon expects the read of the consumer's retention horizon,
// answering h (nil: none recorded).
func (m *Mock) expectHorizon(h *time.Time) {
	q, args := m.hk.HorizonSQL(m.table, m.consumer)
	m.Sqlmock.ExpectQuery(q).WithArgs(driverValues(args)...).WillReturnRows(sqlmock.NewRows([]string{"horizon"}).AddRow(micros(h)))
}

func (m *Mock) expectLockTimeout() {
	if m.lockSQL != "" {
		m.Sqlmock.ExpectExec(m.lockSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	}
}

func (m *Mock) expectLockReset() {
	if m.lockReset != "" {
		m.Sqlmock.ExpectExec(m.lockReset).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	}
}

// notPartitioned panics if the Mock is in partitioned mode, where the
// Middleware refuses a message without an event time before sending
// anything.
func (m *Mock) notPartitioned(helper, instead string) {
	if m.part != nil {
		panic(fmt.Sprintf("mocks: %s: the claim table is partitioned by event day, and the Middleware refuses a message without an event time before sending anything: use %s", helper, instead))
	}
}

// ExpectApplied expects the start of a delivery, of a message without an
// event time, whose claim is new: BEGIN, the claim inserting one row and,
// with WithStrictGuard, the transaction id query. The handler runs next:
// script its statements, then ExpectCommit (or ExpectCommitError), or
// ExpectRollback if the handler fails. A message with an event time is
// ExpectAppliedAt, in either mode: its claim carries the event's fence.
func (m *Mock) ExpectApplied(key string) {
	m.notPartitioned("ExpectApplied", "ExpectAppliedAt")
	m.expectApplied(key, time.Time{})
}

func (m *Mock) expectApplied(key string, at time.Time) {
	m.Sqlmock.ExpectBegin()
	m.expectClaim(key, at).WillReturnResult(sqlmock.NewResult(0, 1))
	m.expectFirstTxID()
}

// expectFirstTxID expects the strict guard's first reading of a new
// transaction id, if the Mock has a strict guard.
func (m *Mock) expectFirstTxID() {
	if m.txidSQL != "" {
		m.txid++
		m.expectTxID()
	}
}

// ExpectDuplicate expects a whole delivery, of a message without an event
// time, whose claim already exists: BEGIN, the claim inserting nothing,
// ROLLBACK. The handler does not run.
func (m *Mock) ExpectDuplicate(key string) {
	m.notPartitioned("ExpectDuplicate", "ExpectDuplicateAt")
	m.expectDuplicate(key, time.Time{})
}

func (m *Mock) expectDuplicate(key string, at time.Time) {
	m.Sqlmock.ExpectBegin()
	m.expectClaim(key, at).WillReturnResult(sqlmock.NewResult(0, 0))
	m.Sqlmock.ExpectRollback()
}

// ExpectClaimError expects a delivery whose claim fails with err: BEGIN,
// the claim, ROLLBACK. If the dialect classifies err as retryable, the
// middleware tries again: script the next attempt after it.
func (m *Mock) ExpectClaimError(key string, err error) {
	m.notPartitioned("ExpectClaimError", "ExpectClaimErrorAt")
	m.expectClaimError(key, time.Time{}, err)
}

func (m *Mock) expectClaimError(key string, at time.Time, err error) {
	m.Sqlmock.ExpectBegin()
	m.expectClaim(key, at).WillReturnError(err)
	m.Sqlmock.ExpectRollback()
}

// ExpectCommit expects the end of an applied delivery: with
// WithStrictGuard, the transaction id query returning the id ExpectApplied
// gave; then COMMIT. It returns COMMIT's expectation.
func (m *Mock) ExpectCommit() *sqlmock.ExpectedCommit {
	if m.txidSQL != "" {
		m.expectTxID()
	}
	return m.Sqlmock.ExpectCommit()
}

// ExpectCommitError is ExpectCommit with COMMIT failing with err.
// database/sql sends no ROLLBACK after a failed COMMIT, so none is
// expected. If the dialect classifies err as retryable, the middleware tries
// again: script the next attempt after it — ExpectApplied if the commit did
// not land, ExpectDuplicate if it did.
func (m *Mock) ExpectCommitError(err error) {
	m.ExpectCommit().WillReturnError(err)
}

// ExpectTxCheck expects the middleware's check of the claim's transaction
// after the handler failed with an error the dialect classifies as
// retryable (a serialization failure, a deadlock, a lost connection):
// SAVEPOINT and RELEASE SAVEPOINT (dialect.ProbeSavepointSQL and
// dialect.ProbeReleaseSQL). err is what the check meets:
//
//   - nil: the transaction is alive, so the handler met its failure
//     elsewhere; ProcessMessage returns it without a retry.
//   - an error, which fails the SAVEPOINT: the transaction was aborted (with
//     Postgres, &pq.Error{Code: "25P02"}) or its connection lost
//     (driver.ErrBadConn). The failure is the transaction's own, and the
//     middleware retries it if it is a serialization failure or deadlock,
//     or if the connection was lost.
//
// Script ExpectRollback next, then the next attempt if there is one.
func (m *Mock) ExpectTxCheck(err error) {
	sp := m.Sqlmock.ExpectExec(dialect.ProbeSavepointSQL).WithoutArgs()
	if err != nil {
		sp.WillReturnError(err)
		return
	}
	sp.WillReturnResult(sqlmock.NewResult(0, 0))
	m.Sqlmock.ExpectExec(dialect.ProbeReleaseSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
}

// ExpectEnsureSchema expects Middleware.EnsureSchema of a claim table that
// exists and is not partitioned. For a dialect that reads its catalog
// (dialect.SchemaInspector, as every dialect of this module does): BEGIN
// (read-only), the dialect's server check if it has one
// (dialect.ServerChecker), its catalog query for each of the table's
// objects (its horizon table's too), answering that it exists, and COMMIT — no DDL. For any other
// dialect: BEGIN, the server check, its schema statements (and its horizon table's) and COMMIT. Then,
// if the dialect can partition (dialect.Partitioner), its query of the
// table's kind, answering that the table exists and is not partitioned.
//
// answers are what the server check's queries return, in order: for the
// Postgres dialect the version, such as "PostgreSQL 16.4"; for SQLite the
// library version, such as "3.46.0"; for MySQL the version, the current
// database (asked only when the table names no schema), InnoDB's support
// and the claim table's engine, such as "10.11.6-MariaDB", "test", "YES".
// A query past the last answer returns no row. ExpectEnsureSchema runs the
// dialect's own check against the answers to learn its queries, and panics
// if the check rejects them or leaves answers unused — a mistake in the
// test.
//
// In partitioned mode (WithDailyPartitions) EnsureSchema also creates the
// day partitions, which ExpectEnsureSchema does not script: it panics.
func (m *Mock) ExpectEnsureSchema(answers ...string) {
	if m.part != nil {
		panic("mocks: ExpectEnsureSchema: scripting EnsureSchema of a partitioned claim table is not supported")
	}
	m.Sqlmock.ExpectBegin()
	m.expectServerCheck(answers)
	if insp, ok := m.d.(dialect.SchemaInspector); ok {
		for _, o := range dialect.ClaimTableObjects(m.d, insp, m.table, false) {
			q, args := insp.ObjectExistsSQL(o)
			e := m.Sqlmock.ExpectQuery(q).WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(true))
			if len(args) > 0 {
				e.WithArgs(driverValues(args)...)
			}
		}
	} else {
		for _, s := range m.schema {
			m.Sqlmock.ExpectExec(s).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
		}
	}
	m.Sqlmock.ExpectCommit()
	if p, ok := m.d.(dialect.Partitioner); ok {
		q, args := p.TableKindSQL(m.table)
		e := m.Sqlmock.ExpectQuery(q).WillReturnRows(sqlmock.NewRows([]string{"exists", "partitioned"}).AddRow(true, false))
		if len(args) > 0 {
			e.WithArgs(driverValues(args)...)
		}
	}
}

func driverValues(args []any) []driver.Value {
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a
	}
	return vals
}

func (m *Mock) expectTxID() {
	rows := sqlmock.NewRows([]string{"txid"}).AddRow(strconv.FormatInt(m.txid, 10))
	m.Sqlmock.ExpectQuery(m.txidSQL).WithoutArgs().WillReturnRows(rows)
}

// serverQuery is one query of a dialect's server check, with its answer
// (nil: no row).
type serverQuery struct {
	query  string
	args   []driver.Value
	answer *string
}

func (m *Mock) expectServerCheck(answers []string) {
	checker, ok := m.d.(dialect.ServerChecker)
	if !ok {
		if len(answers) > 0 {
			panic(fmt.Sprintf("mocks: ExpectEnsureSchema: the %s dialect runs no server check, yet %d answers were given", m.d.Name(), len(answers)))
		}
		return
	}
	var asked []serverQuery
	err := checker.CheckServer(context.Background(), m.table, func(_ context.Context, query string, args ...any) (string, error) {
		q := serverQuery{query: query, args: driverValues(args)}
		if n := len(asked); n < len(answers) {
			q.answer = &answers[n]
		}
		asked = append(asked, q)
		if q.answer == nil {
			return "", sql.ErrNoRows
		}
		return *q.answer, nil
	})
	if err != nil {
		panic(fmt.Sprintf("mocks: ExpectEnsureSchema: the %s dialect's server check rejects the answers %q: %v", m.d.Name(), answers, err))
	}
	if len(asked) < len(answers) {
		panic(fmt.Sprintf("mocks: ExpectEnsureSchema: the %s dialect's server check asks %d queries, yet %d answers were given", m.d.Name(), len(asked), len(answers)))
	}
	for _, q := range asked {
		rows := sqlmock.NewRows([]string{"answer"})
		if q.answer != nil {
			rows.AddRow(*q.answer)
		}
		e := m.Sqlmock.ExpectQuery(q.query).WillReturnRows(rows)
		if len(q.args) > 0 {
			e.WithArgs(q.args...)
		} else {
			e.WithoutArgs()
		}
	}
}
