package mocks

import (
	"fmt"
	"slices"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// ExpectBatchApplied expects the start of a ProcessBatch (or WrapBatch) call
// for keys whose claims are new for the keys in fresh and exist for the
// others: BEGIN, the batch's claim and, with WithStrictGuard, the
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
// partitioned mode, where ProcessBatch (keys alone) refuses batches before sending
// anything.
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

// ExpectBatchDuplicate expects a whole ProcessBatch call whose claims all
// exist: BEGIN, the batch's claim inserting nothing, ROLLBACK. The handler
// does not run.
func (m *Mock) ExpectBatchDuplicate(keys []string) {
	uniq := m.batchKeys("ExpectBatchDuplicate", keys)
	m.Sqlmock.ExpectBegin()
	m.expectBatchClaim(uniq, make([]bool, len(uniq)), nil)
	m.Sqlmock.ExpectRollback()
}

// ExpectBatchClaimError expects a ProcessBatch call whose claim fails with
// err: BEGIN, the batch's claim failing (with a dialect that claims key by
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
// partitioned mode. In partitioned mode each distinct key is claimed by its
// own statement, in ascending key order, in the event day of its first
// message; otherwise the claim is ExpectBatchApplied's. It panics, as
// ExpectBatchApplied does, when fresh is not a non-empty subset of the
// keys, and when the Middleware would refuse the batch before sending
// anything: a message the retention fence refuses, or, in partitioned mode,
// one without an event time.
func (m *Mock) ExpectMessagesApplied(msgs []idempotent.Message, fresh ...string) {
	uniq, days := m.messageKeys("ExpectMessagesApplied", msgs)
	if len(fresh) == 0 {
		panic("mocks: ExpectMessagesApplied: no fresh key: a batch whose claims all exist is ExpectMessagesDuplicate")
	}
	isNew := make([]bool, len(uniq))
	for _, k := range fresh {
		j, ok := slices.BinarySearch(uniq, k)
		if !ok {
			panic(fmt.Sprintf("mocks: ExpectMessagesApplied: fresh key %q is not in the batch", k))
		}
		isNew[j] = true
	}
	m.Sqlmock.ExpectBegin()
	m.expectMessagesClaim(uniq, days, isNew)
	m.expectFirstTxID()
}

// ExpectMessagesDuplicate is ExpectBatchDuplicate for ProcessMessages: BEGIN,
// the batch's claims inserting nothing, ROLLBACK.
func (m *Mock) ExpectMessagesDuplicate(msgs []idempotent.Message) {
	uniq, days := m.messageKeys("ExpectMessagesDuplicate", msgs)
	m.Sqlmock.ExpectBegin()
	m.expectMessagesClaim(uniq, days, make([]bool, len(uniq)))
	m.Sqlmock.ExpectRollback()
}

// messageKeys checks a batch of messages as ProcessMessages does and returns
// its distinct keys in ascending order with, in partitioned mode, the event
// time of each key's first message (nil otherwise).
func (m *Mock) messageKeys(helper string, msgs []idempotent.Message) ([]string, []time.Time) {
	if len(msgs) == 0 {
		panic(fmt.Sprintf("mocks: %s: an empty batch sends nothing", helper))
	}
	first := map[string]time.Time{}
	uniq := make([]string, 0, len(msgs))
	for i, msg := range msgs {
		if !msg.EventTime.IsZero() || m.part != nil {
			if why := m.fenced(msg.EventTime); why != "" {
				panic(fmt.Sprintf("mocks: %s: message %d's event time %s %s, so the Middleware refuses the batch and sends nothing",
					helper, i, msg.EventTime.UTC().Format(time.RFC3339), why))
			}
		}
		if _, seen := first[msg.Key]; !seen {
			first[msg.Key] = msg.EventTime
			uniq = append(uniq, msg.Key)
		}
	}
	slices.Sort(uniq)
	if m.part == nil {
		return uniq, nil
	}
	days := make([]time.Time, len(uniq))
	for j, k := range uniq {
		days[j] = first[k]
	}
	return uniq, days
}

// expectMessagesClaim expects the claims of uniq: the batch claim, or in
// partitioned mode the batch claim with the keys' days where the dialect
// has one (dialect.PartitionedBatchClaimer), else one claim per key in its
// day.
func (m *Mock) expectMessagesClaim(uniq []string, days []time.Time, isNew []bool) {
	if days == nil {
		m.expectBatchClaim(uniq, isNew, nil)
		return
	}
	m.expectLockTimeout()
	if pbc, ok := m.d.(dialect.PartitionedBatchClaimer); ok {
		ds := make([]string, len(days))
		for j, d := range days {
			ds[j] = eventDay(d)
		}
		rows := sqlmock.NewRows([]string{"message_key"})
		for j, k := range uniq {
			if isNew[j] {
				rows.AddRow(k)
			}
		}
		m.Sqlmock.ExpectQuery(pbc.PartitionedBatchClaimSQL(m.table)).
			WithArgs(m.consumer, pbc.BatchKeysArg(uniq), pbc.BatchKeysArg(ds)).WillReturnRows(rows)
		m.expectLockReset()
		return
	}
	for j, k := range uniq {
		n := int64(0)
		if isNew[j] {
			n = 1
		}
		m.Sqlmock.ExpectExec(m.claimSQL).WithArgs(m.consumer, k, eventDay(days[j])).WillReturnResult(sqlmock.NewResult(0, n))
	}
	m.expectLockReset()
}

// batchKeys checks a batch as ProcessBatch does and returns its distinct
// keys in ascending order.
func (m *Mock) batchKeys(helper string, keys []string) []string {
	if m.part != nil {
		panic(fmt.Sprintf("mocks: %s: the claim table is partitioned by event day, and ProcessBatch refuses a batch before sending anything", helper))
	}
	if len(keys) == 0 {
		panic(fmt.Sprintf("mocks: %s: an empty batch sends nothing", helper))
	}
	uniq := slices.Clone(keys)
	slices.Sort(uniq)
	return slices.Compact(uniq)
}

// expectBatchClaim expects the claim of the distinct, ascending keys uniq,
// inserting those with isNew set, or failing with err.
func (m *Mock) expectBatchClaim(uniq []string, isNew []bool, err error) {
	m.expectLockTimeout()
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
	} else {
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
	m.expectLockReset()
}
