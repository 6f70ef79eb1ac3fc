package mocks

import (
	"fmt"
	"slices"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// ExpectBatchApplied expects the start of a ProcessMessages (or
// WrapMessages) call for messages without event times, with keys, whose
// claims are new for the keys in fresh and exist for the others: BEGIN, the batch's claim and, with WithStrictGuard, the
// transaction id query. The handler runs next, once for the new messages:
// script its statements, then ExpectCommit (or ExpectRollback if it fails).
//
// The claim is the dialect's: with a dialect.BatchClaimer (Postgres) one
// query for the distinct keys in ascending order, returning the new ones;
// otherwise one claim statement per distinct key, in ascending order. The
// lock timeout of WithLockTimeout surrounds the whole claim.
//
// fresh must be a non-empty subset of keys (a batch with no new message is
// ExpectBatchDuplicate). ExpectBatchApplied panics otherwise, and in
// partitioned mode, where a message without an event time is refused
// before anything is sent (ExpectMessagesApplied scripts messages with
// theirs).
func (m *Mock) ExpectBatchApplied(keys []string, fresh ...string) {
	uniq := m.batchKeys("ExpectBatchApplied", keys)
	if len(fresh) == 0 {
		panic("mocks: ExpectBatchApplied: no fresh key: a batch whose claims all exist is ExpectBatchDuplicate")
	}
	isNew := make([]bool, len(uniq))
	for _, k := range fresh {
		j, ok := slices.BinarySearch(uniq, k)
		if !ok {
			panic(fmt.Sprintf("mocks: ExpectBatchApplied: fresh key %q is not in the batch", k))
		}
		isNew[j] = true
	}
	m.Sqlmock.ExpectBegin()
	m.expectBatchClaim(uniq, isNew, nil)
	m.expectFirstTxID()
}

// ExpectBatchDuplicate expects a whole ProcessMessages call of messages
// without event times whose claims all exist: BEGIN, the batch's claim
// inserting nothing, ROLLBACK. The handler does not run.
func (m *Mock) ExpectBatchDuplicate(keys []string) {
	uniq := m.batchKeys("ExpectBatchDuplicate", keys)
	m.Sqlmock.ExpectBegin()
	m.expectBatchClaim(uniq, make([]bool, len(uniq)), nil)
	m.Sqlmock.ExpectRollback()
}

// ExpectBatchClaimError expects a ProcessMessages call of messages without
// event times whose claim fails with err: BEGIN, the batch's claim failing (with a dialect that claims key by
// key, the first key's statement fails), ROLLBACK. If the dialect classifies
// err as retryable, the whole batch is tried again: script the next attempt
// after it.
func (m *Mock) ExpectBatchClaimError(keys []string, err error) {
	uniq := m.batchKeys("ExpectBatchClaimError", keys)
	m.Sqlmock.ExpectBegin()
	m.expectBatchClaim(uniq, nil, err)
	m.Sqlmock.ExpectRollback()
}

// ExpectMessagesApplied is ExpectBatchApplied for ProcessMessages (or
// WrapMessages): a batch of messages with their event times, in plain or
// partitioned mode. In partitioned mode the claim carries each distinct
// key's event day, that of its first message: one query for the batch with
// a dialect.PartitionedBatchClaimer (Postgres), else one claim statement
// per key in ascending key order; otherwise the claim is
// ExpectBatchApplied's. Where the dialect keeps a retention horizon
// (dialect.HorizonKeeper), new claims of messages with an event time are
// followed by the read of the horizon, answering none recorded. It panics,
// as ExpectBatchApplied does, when fresh is not a non-empty subset of the
// keys, and when the Middleware would refuse the batch before sending
// anything: a message the retention fence refuses, or, in partitioned mode,
// one without an event time.
func (m *Mock) ExpectMessagesApplied(msgs []idempotent.Message, fresh ...string) {
	b := m.messageKeys("ExpectMessagesApplied", msgs)
	isNew := b.fresh("ExpectMessagesApplied", fresh)
	m.Sqlmock.ExpectBegin()
	m.expectMessagesClaim(b, isNew, nil)
	m.expectFirstTxID()
}

// ExpectMessagesDuplicate is ExpectBatchDuplicate for ProcessMessages: BEGIN,
// the batch's claims inserting nothing, ROLLBACK.
func (m *Mock) ExpectMessagesDuplicate(msgs []idempotent.Message) {
	b := m.messageKeys("ExpectMessagesDuplicate", msgs)
	m.Sqlmock.ExpectBegin()
	m.expectMessagesClaim(b, make([]bool, len(b.uniq)), nil)
	m.Sqlmock.ExpectRollback()
}

// ExpectMessagesBeyondHorizon expects a ProcessMessages call that the
// table's retention horizon refuses: BEGIN, the batch's claims inserting
// those of fresh, the read of the horizon answering horizon, ROLLBACK. The
// handler does not run, and ProcessMessages returns an
// *idempotent.BatchKeyError matching idempotent.ErrBeyondRetention that
// names the first message, in key order, of the first new claim older than
// the horizon. It panics as ExpectMessagesApplied does, where the dialect
// keeps no horizon, and when no new claim's message is older than horizon.
func (m *Mock) ExpectMessagesBeyondHorizon(msgs []idempotent.Message, horizon time.Time, fresh ...string) {
	const helper = "ExpectMessagesBeyondHorizon"
	b := m.messageKeys(helper, msgs)
	isNew := b.fresh(helper, fresh)
	if m.hk == nil {
		panic(fmt.Sprintf("mocks: %s: the %s dialect keeps no retention horizon", helper, m.d.Name()))
	}
	refused := false
	for j, ok := range isNew {
		if ok && m.refuses(b.ats[j], horizon) {
			refused = true
		}
	}
	if !refused {
		panic(fmt.Sprintf("mocks: %s: no new claim's event time is older than the horizon %s: the Middleware would apply the batch",
			helper, horizon.UTC().Format(time.RFC3339)))
	}
	m.Sqlmock.ExpectBegin()
	m.expectMessagesClaim(b, isNew, &horizon)
	m.Sqlmock.ExpectRollback()
}

// messageBatch is a batch of messages as ProcessMessages claims it: its
// distinct keys in ascending order and the event time of each key's first
// message (zero for none).
type messageBatch struct {
	uniq []string
	ats  []time.Time
}

// fresh returns which of b's keys are in fresh, panicking unless fresh is a
// non-empty subset of them.
func (b messageBatch) fresh(helper string, fresh []string) []bool {
	if len(fresh) == 0 {
		panic(fmt.Sprintf("mocks: %s: no fresh key: a batch whose claims all exist is ExpectMessagesDuplicate", helper))
	}
	isNew := make([]bool, len(b.uniq))
	for _, k := range fresh {
		j, ok := slices.BinarySearch(b.uniq, k)
		if !ok {
			panic(fmt.Sprintf("mocks: %s: fresh key %q is not in the batch", helper, k))
		}
		isNew[j] = true
	}
	return isNew
}

// messageKeys checks a batch of messages as ProcessMessages does and returns
// it as the Middleware claims it.
func (m *Mock) messageKeys(helper string, msgs []idempotent.Message) messageBatch {
	if len(msgs) == 0 {
		panic(fmt.Sprintf("mocks: %s: an empty batch sends nothing", helper))
	}
	first := map[string]time.Time{}
	var b messageBatch
	for i, msg := range msgs {
		if !msg.EventTime.IsZero() || m.part != nil {
			if why := m.fenced(msg.EventTime); why != "" {
				panic(fmt.Sprintf("mocks: %s: message %d's event time %s %s, so the Middleware refuses the batch and sends nothing",
					helper, i, msg.EventTime.UTC().Format(time.RFC3339), why))
			}
		}
		if _, seen := first[msg.Key]; !seen {
			first[msg.Key] = msg.EventTime
			b.uniq = append(b.uniq, msg.Key)
		}
	}
	slices.Sort(b.uniq)
	b.ats = make([]time.Time, len(b.uniq))
	for j, k := range b.uniq {
		b.ats[j] = first[k]
	}
	return b
}

// expectMessagesClaim expects the claims of b, inserting those with isNew
// set: the batch claim, or in partitioned mode the batch claim with the
// keys' days where the dialect has one (dialect.PartitionedBatchClaimer),
// else one claim per key in its day; then, where the dialect keeps a
// horizon and a new claim's message has an event time, the horizon's read
// answering horizon (nil: none recorded).
func (m *Mock) expectMessagesClaim(b messageBatch, isNew []bool, horizon *time.Time) {
	uniq := b.uniq
	m.expectLockTimeout()
	switch pbc, ok := m.d.(dialect.PartitionedBatchClaimer); {
	case m.part == nil:
		m.expectBatchStatements(uniq, isNew, nil)
	case ok:
		ds := make([]string, len(uniq))
		for j, at := range b.ats {
			ds[j] = eventDay(at)
		}
		rows := sqlmock.NewRows([]string{"message_key"})
		for j, k := range uniq {
			if isNew[j] {
				rows.AddRow(k)
			}
		}
		m.Sqlmock.ExpectQuery(pbc.PartitionedBatchClaimSQL(m.table)).
			WithArgs(m.consumer, pbc.BatchKeysArg(uniq), pbc.BatchKeysArg(ds)).WillReturnRows(rows)
	default:
		for j, k := range uniq {
			n := int64(0)
			if isNew[j] {
				n = 1
			}
			m.Sqlmock.ExpectExec(m.claimSQL).WithArgs(m.consumer, k, eventDay(b.ats[j])).WillReturnResult(sqlmock.NewResult(0, n))
		}
	}
	if m.hk != nil {
		for j, ok := range isNew {
			if ok && !b.ats[j].IsZero() {
				m.expectHorizon(horizon)
				break
			}
		}
	}
	m.expectLockReset()
}

// batchKeys checks a batch of keys alone as ProcessMessages does and returns its distinct
// keys in ascending order.
func (m *Mock) batchKeys(helper string, keys []string) []string {
	if m.part != nil {
		panic(fmt.Sprintf("mocks: %s: the claim table is partitioned by event day, and ProcessMessages refuses messages without event times before sending anything", helper))
	}
	if len(keys) == 0 {
		panic(fmt.Sprintf("mocks: %s: an empty batch sends nothing", helper))
	}
	uniq := slices.Clone(keys)
	slices.Sort(uniq)
	return slices.Compact(uniq)
}

// expectBatchClaim expects the claim of the distinct, ascending keys uniq,
// inserting those with isNew set, or failing with err, under the lock
// timeout.
func (m *Mock) expectBatchClaim(uniq []string, isNew []bool, err error) {
	m.expectLockTimeout()
	m.expectBatchStatements(uniq, isNew, err)
	m.expectLockReset()
}

// expectBatchStatements expects the batch claim's statements of a table
// that is not partitioned: one query with a dialect.BatchClaimer, else one
// claim statement per key.
func (m *Mock) expectBatchStatements(uniq []string, isNew []bool, err error) {
	if bc, ok := m.d.(dialect.BatchClaimer); ok {
		q := m.Sqlmock.ExpectQuery(bc.BatchClaimSQL(m.table)).WithArgs(m.consumer, bc.BatchKeysArg(uniq))
		if err != nil {
			q.WillReturnError(err)
		} else {
			rows := sqlmock.NewRows([]string{"message_key"})
			for j, k := range uniq {
				if isNew[j] {
					rows.AddRow(k)
				}
			}
			q.WillReturnRows(rows)
		}
		return
	}
	for j, k := range uniq {
		e := m.Sqlmock.ExpectExec(m.claimSQL).WithArgs(m.consumer, k)
		if err != nil {
			e.WillReturnError(err)
			break
		}
		n := int64(0)
		if isNew[j] {
			n = 1
		}
		e.WillReturnResult(sqlmock.NewResult(0, n))
	}
}
