package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// Unit tests of ProcessTx and WrapTx with a transaction type of the test's
// own.

// myTx is a library's transaction type wrapping *sql.Tx.
type myTx struct {
	*sql.Tx
	attempt int
}

func TestProcessTx(t *testing.T) {
	t.Run("each attempt gets its own transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit().WillReturnError(&pq.Error{Code: "40001"})
		expectApplied(r.mock, key)

		begun := 0
		begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
			if db != r.db {
				t.Error("begin got another database than the Middleware's")
			}
			if opts == nil || opts.Isolation != sql.LevelSerializable {
				t.Errorf("begin got options %+v, want the Middleware's", opts)
			}
			tx, err := db.BeginTx(ctx, opts)
			if err != nil {
				return nil, nil, err
			}
			begun++
			return &myTx{Tx: tx, attempt: begun}, tx, nil
		}
		var seen []int
		got, err := idempotent.ProcessTx(context.Background(), mw, key, begin, func(ctx context.Context, tx *myTx) error {
			seen = append(seen, tx.attempt)
			_, err := tx.ExecContext(ctx, effectSQL)
			return err
		})
		if err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		if len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
			t.Fatalf("the handler saw attempts %v, want [1 2]", seen)
		}
		r.wantCalls(t, "BEGIN Serializable", claimSQL, effectSQL, "COMMIT", "BEGIN Serializable", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("begin error is classified", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		expectApplied(r.mock, key)
		calls := 0
		begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
			if calls++; calls == 1 {
				return nil, nil, &pq.Error{Code: "57P03"}
			}
			tx, err := db.BeginTx(ctx, opts)
			return tx, tx, err
		}
		got, err := idempotent.ProcessTx(context.Background(), mw, key, begin, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx) })
		if err != nil || got != idempotent.Applied || calls != 2 {
			t.Fatalf("got (%v, %v) after %d begins, want applied after 2", got, err, calls)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("begin returns no transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		begin := func(context.Context, *sql.DB, *sql.TxOptions) (*myTx, *sql.Tx, error) { return &myTx{}, nil, nil }
		_, err := idempotent.ProcessTx(context.Background(), mw, key, begin, func(context.Context, *myTx) error {
			t.Error("the handler ran without a transaction")
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "returned no *sql.Tx") {
			t.Fatalf("got %v", err)
		}
		r.wantCalls(t)
	})
	t.Run("nil arguments", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
			return nil, nil, nil
		}
		if _, err := idempotent.ProcessTx[*sql.Tx](context.Background(), mw, key, nil, func(context.Context, *sql.Tx) error { return nil }); err == nil {
			t.Fatal("nil begin accepted")
		}
		if _, err := idempotent.ProcessTx(context.Background(), mw, key, begin, nil); err == nil {
			t.Fatal("nil function accepted")
		}
		r.wantCalls(t)
	})
}

func TestWrapTx(t *testing.T) {
	begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		return &myTx{Tx: tx}, tx, nil
	}
	keyOf := func(id int) (string, error) {
		if id == 0 {
			return "", errors.New("no id")
		}
		return key, nil
	}
	handler := func(ctx context.Context, tx *myTx, _ int) error {
		_, err := tx.ExecContext(ctx, effectSQL)
		return err
	}
	t.Run("applies", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		expectApplied(r.mock, key)
		if got, err := idempotent.WrapTx(mw, begin, keyOf, handler)(context.Background(), 9912); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("key function fails", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		got, err := idempotent.WrapTx(mw, begin, keyOf, handler)(context.Background(), 0)
		if got != 0 || !errors.Is(err, idempotent.ErrInvalidKey) || !strings.Contains(err.Error(), "no id") {
			t.Fatalf("got (%v, %v), want ErrInvalidKey", got, err)
		}
		if e := ev.only(t); !errors.Is(e.Err, idempotent.ErrInvalidKey) || e.Consumer != consumer {
			t.Fatalf("event %+v", e)
		}
		r.wantCalls(t)
	})
	t.Run("nil key function or handler", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		if _, err := idempotent.WrapTx(mw, begin, nil, handler)(context.Background(), 1); err == nil {
			t.Fatal("nil key function accepted")
		}
		if _, err := idempotent.WrapTx[int, *myTx](mw, begin, keyOf, nil)(context.Background(), 1); err == nil {
			t.Fatal("nil handler accepted")
		}
		r.wantCalls(t)
	})
}

func TestProcessMessagesTx(t *testing.T) {
	ctx := context.Background()
	begin := func(r *recorded, begun *int) idempotent.BeginFunc[*myTx] {
		return func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
			if db != r.db {
				t.Error("begin got another database than the Middleware's")
			}
			tx, err := db.BeginTx(ctx, opts)
			if err != nil {
				return nil, nil, err
			}
			*begun++
			return &myTx{Tx: tx, attempt: *begun}, tx, nil
		}
	}
	t.Run("each attempt gets its own transaction and the fresh indexes", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		for _, commitErr := range []error{&pq.Error{Code: "40001"}, nil} {
			r.mock.ExpectBegin()
			r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b"})).
				WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("b"))
			expectEffect(r.mock)
			r.mock.ExpectCommit().WillReturnError(commitErr)
		}
		begun := 0
		type seen struct{ attempt, fresh []int }
		var got seen
		outs, err := idempotent.ProcessMessagesTx(ctx, mw, []idempotent.Message{{Key: "b"}, {Key: "a"}}, begin(r, &begun), func(ctx context.Context, tx *myTx, fresh []int) error {
			got.attempt = append(got.attempt, tx.attempt)
			got.fresh = append(got.fresh, fresh...)
			_, err := tx.ExecContext(ctx, effectSQL)
			return err
		})
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate}) {
			t.Fatalf("got (%v, %v), want [applied duplicate]", outs, err)
		}
		if !slices.Equal(got.attempt, []int{1, 2}) || !slices.Equal(got.fresh, []int{0, 0}) {
			t.Fatalf("the handler saw attempts %v with fresh %v, want [1 2] and [0] each time", got.attempt, got.fresh)
		}
		r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT", "BEGIN", batchSQL, effectSQL, "COMMIT")
		if len(ev.outcomes) != 2 || ev.outcomes[0].Outcome != idempotent.Applied || ev.outcomes[0].Attempts != 2 {
			t.Fatalf("events %+v, want one per message, the first applied in 2 attempts", ev.outcomes)
		}
	})
	t.Run("refused before anything is sent", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		begun := 0
		fn := func(context.Context, *myTx, []int) error { t.Error("the handler ran"); return nil }
		if _, err := idempotent.ProcessMessagesTx(ctx, mw, []idempotent.Message{{Key: ""}}, begin(r, &begun), fn); !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Fatalf("an empty key: %v, want ErrInvalidKey", err)
		}
		if _, err := idempotent.ProcessMessagesTx[*myTx](ctx, mw, []idempotent.Message{{Key: "k"}}, nil, fn); err == nil {
			t.Fatal("a nil begin function accepted")
		}
		if outs, err := idempotent.ProcessMessagesTx(ctx, mw, nil, begin(r, &begun), fn); outs != nil || err != nil {
			t.Fatalf("an empty batch: (%v, %v), want (nil, nil)", outs, err)
		}
		r.wantCalls(t)
	})
}
