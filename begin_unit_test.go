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
		got, err := idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, func(ctx context.Context, tx *myTx) error {
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
		got, err := idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx) })
		if err != nil || got != idempotent.Applied || calls != 2 {
			t.Fatalf("got (%v, %v) after %d begins, want applied after 2", got, err, calls)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("begin returns no transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		begin := func(context.Context, *sql.DB, *sql.TxOptions) (*myTx, *sql.Tx, error) { return &myTx{}, nil, nil }
		_, err := idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, func(context.Context, *myTx) error {
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
		if _, err := idempotent.ProcessMessageTx[*sql.Tx](context.Background(), mw, idempotent.Message{Key: key}, nil, func(context.Context, *sql.Tx) error { return nil }); err == nil {
			t.Fatal("nil begin accepted")
		}
		if _, err := idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: key}, begin, nil); err == nil {
			t.Fatal("nil function accepted")
		}
		r.wantCalls(t)
	})
}

func TestWrapMessageTx(t *testing.T) {
	begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		return &myTx{Tx: tx}, tx, nil
	}
	msgOf := func(id int) (idempotent.Message, error) {
		if id == 0 {
			return idempotent.Message{}, errors.New("no id")
		}
		return idempotent.Message{Key: key}, nil
	}
	handler := func(ctx context.Context, tx *myTx, _ int) error {
		_, err := tx.ExecContext(ctx, effectSQL)
		return err
	}
	t.Run("applies", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		expectApplied(r.mock, key)
		if got, err := idempotent.WrapMessageTx(mw, msgOf, begin, handler)(context.Background(), 9912); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	t.Run("message function fails", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		got, err := idempotent.WrapMessageTx(mw, msgOf, begin, handler)(context.Background(), 0)
		if got != 0 || !errors.Is(err, idempotent.ErrInvalidKey) || !strings.Contains(err.Error(), "no id") {
			t.Fatalf("got (%v, %v), want ErrInvalidKey", got, err)
		}
		if e := ev.only(t); !errors.Is(e.Err, idempotent.ErrInvalidKey) || e.Consumer != consumer {
			t.Fatalf("event %+v", e)
		}
		r.wantCalls(t)
	})
	t.Run("nil message function, begin or handler", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		if _, err := idempotent.WrapMessageTx(mw, nil, begin, handler)(context.Background(), 1); err == nil {
			t.Fatal("nil message function accepted")
		}
		if _, err := idempotent.WrapMessageTx[int, *myTx](mw, msgOf, nil, handler)(context.Background(), 1); err == nil {
			t.Fatal("nil begin accepted")
		}
		if _, err := idempotent.WrapMessageTx[int, *myTx](mw, msgOf, begin, nil)(context.Background(), 1); err == nil {
			t.Fatal("nil handler accepted")
		}
		r.wantCalls(t)
	})
}

func TestWrapMessagesTx(t *testing.T) {
	ctx := context.Background()
	begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		return &myTx{Tx: tx}, tx, nil
	}
	type order struct{ id string }
	msgOf := func(o order) (idempotent.Message, error) {
		if o.id == "" {
			return idempotent.Message{}, errors.New("no id")
		}
		return idempotent.Message{Key: o.id}, nil
	}
	t.Run("the handler gets the new messages, in their order, on its own transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b", "c"})).
			WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("c").AddRow("a"))
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		var got []order
		outs, err := idempotent.WrapMessagesTx(mw, msgOf, begin, func(ctx context.Context, tx *myTx, os []order) error {
			got = append(got, os...)
			_, err := tx.ExecContext(ctx, effectSQL)
			return err
		})(ctx, []order{{"c"}, {"b"}, {"a"}})
		want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Applied}
		if err != nil || !slices.Equal(outs, want) {
			t.Fatalf("got (%v, %v), want %v", outs, err, want)
		}
		if !slices.Equal(got, []order{{"c"}, {"a"}}) {
			t.Fatalf("the handler got %v, want [{c} {a}]", got)
		}
		r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT")
	})
	t.Run("refused before anything is sent", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMiddleware(t, r, idempotent.WithObserver(ev))
		h := func(context.Context, *myTx, []order) error { t.Error("the handler ran"); return nil }
		_, err := idempotent.WrapMessagesTx(mw, msgOf, begin, h)(ctx, []order{{"a"}, {""}})
		var bke *idempotent.BatchKeyError
		if !errors.As(err, &bke) || bke.Index != 1 || !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Fatalf("a failing message function: %v, want a BatchKeyError for message 1 matching ErrInvalidKey", err)
		}
		if e := ev.only(t); !errors.Is(e.Err, idempotent.ErrInvalidKey) {
			t.Fatalf("event %+v, want the refusal", e)
		}
		if _, err := idempotent.WrapMessagesTx(mw, msgOf, begin, h)(ctx, make([]order, idempotent.MaxBatchSize+1)); !errors.Is(err, idempotent.ErrBatchTooLarge) {
			t.Fatalf("too large a batch: %v, want ErrBatchTooLarge", err)
		}
		if _, err := idempotent.WrapMessagesTx[order, *myTx](mw, msgOf, nil, h)(ctx, []order{{"a"}}); err == nil {
			t.Fatal("nil begin accepted")
		}
		if outs, err := idempotent.WrapMessagesTx(mw, msgOf, begin, h)(ctx, nil); outs != nil || err != nil {
			t.Fatalf("an empty batch: (%v, %v), want (nil, nil)", outs, err)
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
