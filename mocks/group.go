package mocks

import (
	"database/sql/driver"
	"fmt"
	"sync"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent/dialect"
)

// A coalesced group (idempotent.WithCoalescing) runs its members in one
// transaction, in key order, each claimed just before its handler runs:
//
//	m.ExpectGroupBegin()
//	m.ExpectGroupApplied("order-completed:1") // its claim; its handler runs next
//	m.ExpectExec(creditSQL).WithArgs(50, 1).WillReturnResult(sqlmock.NewResult(0, 1))
//	m.ExpectGroupDuplicate("order-completed:2") // claimed before: no handler
//	m.ExpectGroupApplied("order-completed:3")
//	m.ExpectExec(creditSQL).WithArgs(50, 3).WillReturnResult(sqlmock.NewResult(0, 1))
//	m.ExpectGroupCommit()
//
// The helpers script what the Middleware sends between the handlers, which
// depends on its design. Optimistic, on a dialect.TxFencer (Postgres):
// claims are the plain ones until the first handler, the fence (marking
// the transaction with a random token, and bounding the group's lock
// waits) comes just before it, every claim after a handler is the fenced
// claim, and the fence's check follows the last handler. With savepoints
// (Coalescing.Savepoints, and the optimistic design's on a dialect without
// a fence: MySQL, MariaDB, SQLite): the lock wait bound after BEGIN, and
// each member's claim between SAVEPOINT and its RELEASE, which follows its
// handler; on a dialect.StatementJoiner (Postgres) a member's RELEASE is
// sent with the next member's SAVEPOINT as one statement, the bound with
// the first, and the last member's RELEASE alone, as the helpers script. The lock timeout of WithLockTimeout surrounds each claim (the
// group's lock wait bound is set again after it), and the strict guard
// reads the transaction id after the first new claim, after each handler
// and before COMMIT.

// group is the state of the coalesced group's transaction being scripted.
type group struct {
	token   *groupToken
	fenced  bool // the fence has marked the transaction
	handler bool // a member's handler runs: its end is yet to be scripted
	check   bool // a handler ran since the last fenced statement
	applied bool // a member's claim was new
	txid    bool // the strict guard's first reading was taken
	// With a joiner: the group's lock wait bound, or the last member's
	// RELEASE, is yet to be sent, with the next SAVEPOINT (or, for a
	// RELEASE, alone before COMMIT).
	waitPending, releasePending bool
}

// groupToken is a sqlmock.Argument matching a group transaction's fence
// token, which the Middleware draws at random: any non-empty string the
// first time, then only that string.
type groupToken struct {
	mu sync.Mutex
	v  driver.Value
}

// Match is sqlmock.Argument.Match.
func (g *groupToken) Match(v driver.Value) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.v == nil {
		if s, ok := v.(string); !ok || s == "" {
			return false
		}
		g.v = v
		return true
	}
	return v == g.v
}

// ExpectGroupBegin expects the start of one transaction of a coalesced
// group: BEGIN and, with savepoints, the bound of the group's lock waits
// where the dialect sets one (Coalescing.LockWait). Script each member
// that runs in it after, in key order — ExpectGroupApplied and its
// handler's statements, or ExpectGroupDuplicate — then ExpectGroupCommit.
// A group that runs again (a member failed alone, see
// idempotent.WithCoalescing) is ExpectRollback and ExpectGroupBegin again.
// It panics on a Mock made without WithCoalescing (ForMiddleware passes
// it).
func (m *Mock) ExpectGroupBegin() {
	if m.groupCo.Max == 0 {
		panic("mocks: ExpectGroupBegin: the Mock has no WithCoalescing")
	}
	m.grp = &group{token: &groupToken{}}
	m.Sqlmock.ExpectBegin()
	if m.fenceSQL == "" && m.groupWaitSQL != "" {
		if m.joiner != nil {
			m.grp.waitPending = true
		} else {
			m.expectGroupWait()
		}
	}
}

// ExpectGroupApplied expects the claim of a group's member, new, without
// an event time, just before its handler runs: script the handler's
// statements next. See ExpectGroupBegin.
func (m *Mock) ExpectGroupApplied(key string) {
	m.notPartitioned("ExpectGroupApplied", "ExpectGroupAppliedAt")
	m.expectGroupClaim("ExpectGroupApplied", key, time.Time{}, true)
}

// ExpectGroupAppliedAt is ExpectGroupApplied for a message with event
// time at.
func (m *Mock) ExpectGroupAppliedAt(key string, at time.Time) {
	m.mustPass("ExpectGroupAppliedAt", at)
	m.expectGroupClaim("ExpectGroupAppliedAt", key, at, true)
}

// ExpectGroupDuplicate expects the claim of a group's member, without an
// event time, that was claimed before: its handler does not run.
func (m *Mock) ExpectGroupDuplicate(key string) {
	m.notPartitioned("ExpectGroupDuplicate", "ExpectGroupDuplicateAt")
	m.expectGroupClaim("ExpectGroupDuplicate", key, time.Time{}, false)
}

// ExpectGroupDuplicateAt is ExpectGroupDuplicate for a message with event
// time at.
func (m *Mock) ExpectGroupDuplicateAt(key string, at time.Time) {
	m.mustPass("ExpectGroupDuplicateAt", at)
	m.expectGroupClaim("ExpectGroupDuplicateAt", key, at, false)
}

// ExpectGroupCommit expects the end of a group's transaction after its
// last member: what follows the last handler (the fence's check, or its
// savepoint's RELEASE; the strict guard's reading), the strict guard's
// reading before COMMIT, and COMMIT, whose expectation it returns. A group
// none of whose members was new rolls back instead: script ExpectRollback
// after its last ExpectGroupDuplicate. It panics then, and without
// ExpectGroupBegin.
func (m *Mock) ExpectGroupCommit() *sqlmock.ExpectedCommit {
	g := m.group("ExpectGroupCommit")
	if !g.applied {
		panic("mocks: ExpectGroupCommit: no member of the group was new: the Middleware rolls it back (ExpectRollback)")
	}
	m.endHandler()
	m.flushRelease()
	if g.check {
		m.Sqlmock.ExpectExec(m.checkSQL).WithArgs(g.token).WillReturnResult(sqlmock.NewResult(0, 0))
	}
	m.grp = nil
	if m.txidSQL != "" {
		m.expectTxID()
	}
	return m.Sqlmock.ExpectCommit()
}

// ExpectRollback expects a ROLLBACK: sqlmock's, preceded, in a group's
// transaction with savepoints on a dialect.StatementJoiner (Postgres),
// by the last member's RELEASE when that member was a duplicate, which the
// Middleware sends alone before rolling back a group none of whose members
// was new. It ends the group being scripted.
func (m *Mock) ExpectRollback() *sqlmock.ExpectedRollback {
	if g := m.grp; g != nil {
		if !g.handler {
			m.flushRelease()
		}
		m.grp = nil
	}
	return m.Sqlmock.ExpectRollback()
}

// group returns the group being scripted, panicking outside one.
func (m *Mock) group(helper string) *group {
	if m.grp == nil {
		panic(fmt.Sprintf("mocks: %s: no group's transaction was begun (ExpectGroupBegin)", helper))
	}
	return m.grp
}

// endHandler scripts what follows a member's handler, if one runs: the
// strict guard's reading and, with savepoints, the RELEASE.
func (m *Mock) endHandler() {
	g := m.grp
	if !g.handler {
		return
	}
	g.handler = false
	if m.txidSQL != "" {
		m.expectTxID()
	}
	if m.fenceSQL == "" {
		m.expectRelease()
	} else {
		g.check = true
	}
}

// expectRelease scripts a member's RELEASE: at once, or, with a joiner,
// with the next member's SAVEPOINT (expectSavepoint) or before COMMIT
// (flushRelease).
func (m *Mock) expectRelease() {
	if m.joiner != nil {
		m.grp.releasePending = true
		return
	}
	m.expectExec(dialect.MessageReleaseSQL)
}

// expectSavepoint scripts a member's SAVEPOINT, joined with what a joiner
// holds back: the last member's RELEASE, or the group's lock wait bound.
func (m *Mock) expectSavepoint() {
	g := m.grp
	switch {
	case g.releasePending:
		g.releasePending = false
		m.expectExec(m.joiner.JoinSQL(dialect.MessageReleaseSQL, dialect.MessageSavepointSQL))
	case g.waitPending:
		g.waitPending = false
		m.expectExec(m.joiner.JoinSQL(m.groupWaitSQL, dialect.MessageSavepointSQL))
	default:
		m.expectExec(dialect.MessageSavepointSQL)
	}
}

// flushRelease scripts the last member's RELEASE, held back by a joiner,
// alone.
func (m *Mock) flushRelease() {
	if g := m.grp; g.releasePending {
		g.releasePending = false
		m.expectExec(dialect.MessageReleaseSQL)
	}
}

// expectGroupClaim scripts a member's claim, new or not, and what comes
// between it and its handler.
func (m *Mock) expectGroupClaim(helper, key string, at time.Time, isNew bool) {
	g := m.group(helper)
	m.endHandler()
	if m.fenceSQL == "" {
		m.expectSavepoint()
	}
	n := int64(0)
	if isNew {
		n = 1
	}
	if g.fenced {
		m.expectLockTimeout()
		args := []driver.Value{m.consumer, key}
		if m.part != nil {
			args = append(args, eventDay(at))
		}
		q := m.fclaimSQL
		folded := m.fhclaimSQL != "" && !at.IsZero()
		if folded {
			q, args = m.fhclaimSQL, append(args, m.fenceValue(at))
		}
		m.Sqlmock.ExpectExec(q).WithArgs(append(args, g.token)...).WillReturnResult(sqlmock.NewResult(0, n))
		switch {
		case isNew:
			m.expectHorizonAfterClaim(at, nil)
		case folded:
			m.expectHorizon(nil)
		}
		m.expectLockReset()
		g.check = false
	} else {
		m.expectClaim(key, at).WillReturnResult(sqlmock.NewResult(0, n))
	}
	if !isNew {
		if m.fenceSQL == "" {
			m.expectRelease()
		}
		return
	}
	g.applied = true
	if m.txidSQL != "" && !g.txid {
		g.txid = true
		m.txid++
		m.expectTxID()
	}
	switch {
	case m.fenceSQL != "" && !g.fenced:
		m.Sqlmock.ExpectExec(m.fenceSQL).WithArgs(g.token).WillReturnResult(sqlmock.NewResult(0, 0))
		g.fenced = true
	case m.lockSQL != "" && m.groupWaitSQL != "":
		// The claim's own lock timeout lasts to the end of the
		// transaction: the group's bound again.
		m.expectGroupWait()
	}
	g.handler = true
}

func (m *Mock) expectGroupWait() {
	m.expectExec(m.groupWaitSQL)
}

// expectExec expects q, without arguments, affecting no row.
func (m *Mock) expectExec(q string) {
	m.Sqlmock.ExpectExec(q).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
}
