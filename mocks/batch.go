package mocks

import (
	"fmt"
	"slices"

	"github.com/DATA-DOG/go-sqlmock"

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
// partitioned mode, where ProcessBatch refuses batches before sending
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
