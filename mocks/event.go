package mocks

import (
	"fmt"
	"time"
)

// The event-time helpers script messages that carry their
// producer-assigned event time (ProcessMessage, WrapMessage, ClaimMessage
// and the others), in plain and partitioned mode: the claim
// carries the event's fence value (see ExpectClaim). They check the
// event time against the retention fence the Mock was told of
// (WithRetention, WithClockSkew, WithClock, or the Middleware's own with
// ForMiddleware) and panic if the Middleware would refuse it before sending
// anything: script such a message with ExpectFenced instead. In partitioned
// mode (WithDailyPartitions) the claim carries the event's UTC day.

// ExpectClaimAt is ExpectClaim for ClaimMessage: the claim
// of key with event time at, which the test completes with one of the
// Claim's Will methods — Claim.WillRefuse for a claim the table's retention
// horizon refuses.
func (m *Mock) ExpectClaimAt(key string, at time.Time) *Claim {
	m.mustPass("ExpectClaimAt", at)
	return m.expectClaim(key, at)
}

// ExpectAppliedAt is ExpectApplied for a message with event time at: BEGIN,
// the claim inserting one row (in partitioned mode, in at's day) and, with
// WithStrictGuard, the transaction id query. Script the handler's
// statements, then ExpectCommit.
func (m *Mock) ExpectAppliedAt(key string, at time.Time) {
	m.mustPass("ExpectAppliedAt", at)
	m.expectApplied(key, at)
}

// ExpectDuplicateAt is ExpectDuplicate for a message with event time at:
// BEGIN, the claim inserting nothing, ROLLBACK.
func (m *Mock) ExpectDuplicateAt(key string, at time.Time) {
	m.mustPass("ExpectDuplicateAt", at)
	m.expectDuplicate(key, at)
}

// ExpectClaimErrorAt is ExpectClaimError for a message with event time at:
// BEGIN, the claim failing with err, ROLLBACK. For a day whose partition
// does not exist yet, err is the dialect's error for it — with Postgres,
// &pq.Error{Code: "23514"} — and ProcessMessage returns an error matching
// idempotent.ErrNoPartition without a retry.
func (m *Mock) ExpectClaimErrorAt(key string, at time.Time, err error) {
	m.mustPass("ExpectClaimErrorAt", at)
	m.expectClaimError(key, at, err)
}

// ExpectBeyondHorizonAt expects a delivery of a message with event time at
// that the table's retention horizon refuses: BEGIN, the claim refused by
// horizon (see Claim.WillRefuse), ROLLBACK. The handler does not run, and
// ProcessMessage returns an error matching idempotent.ErrBeyondRetention. Use
// it for a message inside this Middleware's retention window whose claim a
// cleanup or partition drop, run with a shorter window, may have forgotten.
// It panics where Claim.WillRefuse does.
func (m *Mock) ExpectBeyondHorizonAt(key string, at, horizon time.Time) {
	m.mustPass("ExpectBeyondHorizonAt", at)
	m.mustRefuse("ExpectBeyondHorizonAt", at, horizon)
	m.Sqlmock.ExpectBegin()
	m.expectClaim(key, at).WillRefuse(horizon)
	m.Sqlmock.ExpectRollback()
}

// ExpectFenced scripts a message the retention fence refuses: nothing, as
// ProcessMessage returns an error matching idempotent.ErrBeyondRetention (at
// is older than the window) or idempotent.ErrInvalidEventTime (at is zero
// or later than the clock plus the clock-skew margin) before it sends a
// statement. It panics if the fence would let at through: the test means
// another delivery.
func (m *Mock) ExpectFenced(at time.Time) {
	if m.fenced(at) == "" {
		panic(fmt.Sprintf("mocks: ExpectFenced: event time %s is inside the retention window of %v: the Middleware would claim it",
			at.UTC().Format(time.RFC3339), m.fence.window))
	}
}

// mustPass panics if the fence refuses at.
func (m *Mock) mustPass(helper string, at time.Time) {
	if why := m.fenced(at); why != "" {
		panic(fmt.Sprintf("mocks: %s: event time %s %s, so the Middleware sends nothing: use ExpectFenced", helper, at.UTC().Format(time.RFC3339), why))
	}
}

// fenced says why the retention fence refuses at, or "" if it lets it
// through; the Middleware's checkEvent decides the same way.
func (m *Mock) fenced(at time.Time) string {
	if at.IsZero() {
		return "is zero"
	}
	now := m.fence.clock()
	if at.Before(now.Add(-m.fence.window)) {
		return fmt.Sprintf("is older than the retention window of %v", m.fence.window)
	}
	if at.After(now.Add(m.fence.skew)) {
		return fmt.Sprintf("is later than the clock plus the clock-skew margin of %v", m.fence.skew)
	}
	return ""
}

// eventDay returns the claim's event day argument in partitioned mode: at's
// UTC date.
func eventDay(at time.Time) string { return at.UTC().Format(time.DateOnly) }

// dayOf returns the UTC midnight starting at's UTC day.
func dayOf(at time.Time) time.Time {
	y, mo, d := at.UTC().Date()
	return time.Date(y, mo, d, 0, 0, 0, 0, time.UTC)
}
