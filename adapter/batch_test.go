package adapter_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// TestProcessBatchSetsAsideThePoisonItem: of a batch of four, one could not
// be read (set aside before any transaction), and the handler names one of
// the three it is given as poison: that attempt rolls back, the other two
// are claimed and applied again without it, and each delivery gets its own
// result.
func TestProcessBatchSetsAsideThePoisonItem(t *testing.T) {
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectBatchApplied([]string{"a", "b", "c"}, "a", "b", "c")
	mock.ExpectRollback()
	m.ExpectBatchApplied([]string{"a", "c"}, "a", "c")
	m.ExpectCommit()

	ds := []string{"a", "b", "unreadable", "c"}
	msgs := []idempotent.Message{{Key: "a"}, {Key: "b"}, {}, {Key: "c"}}
	errRead := errors.New("no key")
	errs := []error{nil, nil, errRead, nil}
	errBad := errors.New("bad order")
	var runs [][]string
	res := adapter.ProcessBatch(context.Background(), mw, ds, msgs, errs, func(_ context.Context, _ *sql.Tx, fresh []string) error {
		runs = append(runs, append([]string(nil), fresh...))
		for i, d := range fresh {
			if d == "b" {
				return adapter.PoisonItem(i, errBad)
			}
		}
		return nil
	})
	if len(runs) != 2 || len(runs[0]) != 3 || len(runs[1]) != 2 || runs[1][0] != "a" || runs[1][1] != "c" {
		t.Fatalf("handler runs %v, want [a b c] then [a c]", runs)
	}
	want := []struct {
		out idempotent.Outcome
		err error
	}{{idempotent.Applied, nil}, {0, errBad}, {0, errRead}, {idempotent.Applied, nil}}
	for i, w := range want {
		if res[i].Outcome != w.out || !errors.Is(res[i].Err, w.err) || (w.err == nil) != (res[i].Err == nil) {
			t.Errorf("%s: %+v, want %v, %v", ds[i], res[i], w.out, w.err)
		}
	}
	if !adapter.IsPoison(res[1].Err) {
		t.Errorf("b's error %v is not poison", res[1].Err)
	}
}
