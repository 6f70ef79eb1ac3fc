package idempotent_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// Shared fixtures of the unit tests.

const (
	consumer  = "loyalty"
	key       = "order-completed:9912"
	effectSQL = "UPDATE balances SET points = points + 50 WHERE customer_id = 7"
)

var (
	pg = postgres.New()
	// claimSQL is the Postgres dialect's claim of a message without an
	// event time, which no retention horizon refuses.
	claimSQL = pg.ClaimSQL(dialect.Table{Name: idempotent.DefaultTable})
	// horizonClaimSQL is the claim of a message with an event time: one
	// query that inserts the claim unless the table's retention horizon
	// refuses it, and returns how many it inserted and the horizon it read.
	horizonClaimSQL = pg.HorizonClaimSQL(dialect.Table{Name: idempotent.DefaultTable}, false)
	txidSQL         = pg.TxIDSQL()
	// noWait retries at once, so that tests do not sleep.
	noWait = idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 5})
)

// newMiddleware returns a Middleware on r's database with the Postgres
// dialect, retrying without backoff unless opts say otherwise.
func newMiddleware(t *testing.T, r *recorded, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	mw, err := idempotent.New(r.db, pg, consumer, append([]idempotent.Option{noWait}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// effect is a handler that runs effectSQL through tx.
func effect(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, effectSQL)
	return err
}

// Script helpers, spelled out here rather than taken from package mocks so
// that the middleware's tests do not depend on the helpers they back.

// expectClaim scripts the claim of k, a message without an event time (the
// plain claim: no horizon can refuse it), inserting rows (1 or 0).
func expectClaim(m sqlmock.Sqlmock, k string, rows int64) {
	m.ExpectExec(claimSQL).WithArgs(consumer, k).WillReturnResult(sqlmock.NewResult(0, rows))
}

// expectClaimError scripts the claim of k, a message without an event
// time, failing with err.
func expectClaimError(m sqlmock.Sqlmock, k string, err error) {
	m.ExpectExec(claimSQL).WithArgs(consumer, k).WillReturnError(err)
}

// notInserted is the answer of a claim that inserted nothing.
var notInserted = sqlmock.NewResult(0, 0)

func expectEffect(m sqlmock.Sqlmock) {
	m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
}

// expectProbe scripts the middleware's check of the transaction after a
// handler failed with a retryable-looking error: SAVEPOINT failing with err
// (the transaction aborted, or its connection lost), or, with err nil,
// SAVEPOINT and RELEASE succeeding (the transaction is alive).
func expectProbe(m sqlmock.Sqlmock, err error) {
	if err != nil {
		m.ExpectExec(dialect.ProbeSavepointSQL).WithoutArgs().WillReturnError(err)
		return
	}
	m.ExpectExec(dialect.ProbeSavepointSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectExec(dialect.ProbeReleaseSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
}

// aborted is Postgres's answer to a statement in an aborted transaction.
var aborted = &pq.Error{Code: "25P02", Message: "current transaction is aborted, commands ignored until end of transaction block"}

// expectApplied scripts a whole applied delivery.
func expectApplied(m sqlmock.Sqlmock, k string) {
	m.ExpectBegin()
	expectClaim(m, k, 1)
	expectEffect(m)
	m.ExpectCommit()
}

// events is an Observer that keeps what it is told.
type events struct {
	mu       sync.Mutex
	outcomes []idempotent.Event
	retries  []idempotent.RetryEvent
	onRetry  func(idempotent.RetryEvent)
}

func (e *events) Outcome(_ context.Context, ev idempotent.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.outcomes = append(e.outcomes, ev)
}

func (e *events) Retry(_ context.Context, ev idempotent.RetryEvent) {
	e.mu.Lock()
	e.retries = append(e.retries, ev)
	f := e.onRetry
	e.mu.Unlock()
	if f != nil {
		f(ev)
	}
}

// only returns the one outcome event, failing the test if there is not
// exactly one.
func (e *events) only(t *testing.T) idempotent.Event {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.outcomes) != 1 {
		t.Fatalf("%d outcome events, want 1: %+v", len(e.outcomes), e.outcomes)
	}
	return e.outcomes[0]
}

// flagCtx is a context whose Err is set by end() while its Done channel is
// nil: database/sql then never rolls back behind the middleware's back, so a
// test can end the context during an attempt and still see every call in
// order.
type flagCtx struct {
	context.Context
	ended atomic.Bool
}

func newFlagCtx() *flagCtx { return &flagCtx{Context: context.Background()} }

func (c *flagCtx) end() { c.ended.Store(true) }

func (c *flagCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
