package mocks_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
)

// TestModes runs batches, natural keys and event-time deliveries against
// the Mock's scripts, for every dialect and configuration, with the Mock
// made by ForMiddleware alone: dialects without a batch claim statement
// (MySQL, SQLite, the fake) claim a batch key by key, in ascending order.
func TestModes(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := idempotent.WithClock(func() time.Time { return now })
	keys := []string{"c", "a", "b", "a"}
	const insert = "INSERT INTO point_ledger (order_id) VALUES (9912)"
	type result struct {
		outcomes []idempotent.Outcome
		err      error
	}
	batch := func(mw *idempotent.Middleware) result {
		got, err := mw.ProcessMessages(context.Background(), keyMessages(keys...), func(ctx context.Context, tx *sql.Tx, _ []int) error { return effect(ctx, tx) })
		return result{got, err}
	}
	one := func(o idempotent.Outcome, err error) result { return result{[]idempotent.Outcome{o}, err} }
	A, D := idempotent.Applied, idempotent.Duplicate
	scenarios := []struct {
		name   string
		script func(m *mocks.Mock, dc dialectCase)
		run    func(mw *idempotent.Middleware) result
		want   []idempotent.Outcome
	}{
		{"batch-applied", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectBatchApplied(keys, "a", "c")
			expectEffect(m)
			m.ExpectCommit()
		}, batch, []idempotent.Outcome{A, A, D, D}},
		{"batch-duplicate", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectBatchDuplicate(keys)
		}, batch, []idempotent.Outcome{D, D, D, D}},
		{"batch-retryable-then-applied", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectBatchClaimError(keys, dc.retryable)
			m.ExpectBatchApplied(keys, "b")
			expectEffect(m)
			m.ExpectCommit()
		}, batch, []idempotent.Outcome{D, D, A, D}},
		{"natural", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectNatural()
			m.ExpectExec(insert).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
			m.ExpectCommit()
		}, func(mw *idempotent.Middleware) result {
			return one(mw.ProcessNatural(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
				res, err := tx.ExecContext(ctx, insert)
				if err != nil {
					return false, err
				}
				n, err := res.RowsAffected()
				return n == 1, err
			}))
		}, []idempotent.Outcome{D}},
		{"event-applied", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectAppliedAt(key, now.Add(-time.Hour))
			expectEffect(m)
			m.ExpectCommit()
		}, func(mw *idempotent.Middleware) result {
			return one(mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: now.Add(-time.Hour)}, effect))
		}, []idempotent.Outcome{A}},
		{"event-fenced", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectFenced(now.AddDate(0, 0, -31))
		}, func(mw *idempotent.Middleware) result {
			o, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: now.AddDate(0, 0, -31)}, effect)
			if errors.Is(err, idempotent.ErrBeyondRetention) {
				err = nil
			}
			return one(o, err)
		}, []idempotent.Outcome{0}},
	}
	for _, dc := range dialects {
		for _, cfg := range configs {
			if !supports(dc.d, cfg) {
				continue
			}
			for _, sc := range scenarios {
				t.Run(dc.name+"/"+cfg.name+"/"+sc.name, func(t *testing.T) {
					t.Parallel()
					db, mock := mocks.New(t)
					mw, err := idempotent.New(db, dc.d, "loyalty", append([]idempotent.Option{fastRetry, clock}, cfg.mw...)...)
					if err != nil {
						t.Fatal(err)
					}
					sc.script(mocks.ForMiddleware(mock, mw), dc)
					got := sc.run(mw)
					if got.err != nil || !slices.Equal(got.outcomes, sc.want) {
						t.Fatalf("got (%v, %v), want %v", got.outcomes, got.err, sc.want)
					}
				})
			}
		}
	}
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
