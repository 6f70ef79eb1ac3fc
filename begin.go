package idempotent

import (
	"context"
	"database/sql"
	"errors"
)

// BeginFunc begins one attempt's transaction for ProcessMessageTx,
// ProcessMessagesTx, WrapMessageTx and WrapMessagesTx, for a library that wraps *sql.Tx in a type of its own (T),
// such as sqlx's *sqlx.Tx. It must begin the transaction on db — the
// Middleware's database — with ctx and opts exactly as given: the autocommit guard and the isolation
// level set by WithTxOptions travel in them. It returns the transaction both
// as T, which the handler gets, and as the *sql.Tx inside it, in which the
// middleware claims and which it commits or rolls back.
//
// With sqlx:
//
//	func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sqlx.Tx, *sql.Tx, error) {
//		tx, err := sqlx.NewDb(db, "postgres").BeginTxx(ctx, opts)
//		if err != nil {
//			return nil, nil, err
//		}
//		return tx, tx.Tx, nil
//	}
//
// The idemsqlx package is exactly that.
type BeginFunc[T any] func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (T, *sql.Tx, error)

// ProcessMessageTx is [Middleware.ProcessMessage] for a function that
// works on T, a transaction type of a library built on database/sql: each
// attempt's transaction is begun by begin instead of db.BeginTx, and fn gets
// it as T. Everything else — claim, retention fence, partitioned mode,
// retries, guard, observer — is ProcessMessage's.
func ProcessMessageTx[T any](ctx context.Context, m *Middleware, msg Message, begin BeginFunc[T], fn func(ctx context.Context, tx T) error) (Outcome, error) {
	if begin == nil || fn == nil {
		return 0, errors.New("idempotent: ProcessMessageTx: nil begin or function")
	}
	var cur T
	r := m.run
	r.begin = beginAs(begin, &cur)
	return m.processMessage(ctx, &r, msg, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx, cur) })
}

// ProcessMessagesTx is [Middleware.ProcessMessages] for a function that
// works on T, a transaction type of a library built on database/sql: each
// attempt's transaction is begun by begin instead of db.BeginTx, and fn gets
// it as T with the indexes of the new messages. Everything else — one claim
// statement, retention fence, partitioned mode, pre-check, retries, guard,
// observer — is ProcessMessages'.
func ProcessMessagesTx[T any](ctx context.Context, m *Middleware, msgs []Message, begin BeginFunc[T], fn func(ctx context.Context, tx T, fresh []int) error) ([]Outcome, error) {
	if begin == nil || fn == nil {
		return nil, errors.New("idempotent: ProcessMessagesTx: nil begin or function")
	}
	var cur T
	r := m.run
	r.begin = beginAs(begin, &cur)
	return m.processObserved(ctx, &r, msgs, func(ctx context.Context, _ *sql.Tx, fresh []int) error { return fn(ctx, cur, fresh) })
}

// beginAs adapts begin to the runner's begin, keeping each attempt's T in
// cur.
func beginAs[T any](begin BeginFunc[T], cur *T) func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error) {
	return func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error) {
		t, tx, err := begin(ctx, db, opts)
		if err != nil {
			return nil, err
		}
		if tx == nil {
			return nil, errors.New("idempotent: the begin function returned no *sql.Tx")
		}
		*cur = t
		return tx, nil
	}
}

// WrapMessageTx is [WrapMessage] for handlers that work on T, a transaction
// type of a library built on database/sql; see [ProcessMessageTx] and
// [BeginFunc]. msg returns the message's key and, when it has one, its
// event time. If msg fails, the returned function returns an error matching
// ErrInvalidKey without opening a transaction.
func WrapMessageTx[M, T any](m *Middleware, msg func(M) (Message, error), begin BeginFunc[T], h func(ctx context.Context, tx T, msg M) error) func(ctx context.Context, msg M) (Outcome, error) {
	return func(ctx context.Context, v M) (Outcome, error) {
		if msg == nil || begin == nil || h == nil {
			return 0, errors.New("idempotent: WrapMessageTx: nil message function, begin or handler")
		}
		mm, err := messageOf(ctx, m, msg, v)
		if err != nil {
			return 0, err
		}
		return ProcessMessageTx(ctx, m, mm, begin, func(ctx context.Context, tx T) error { return h(ctx, tx, v) })
	}
}

// WrapMessagesTx is [WrapMessages] for handlers that work on T, a
// transaction type of a library built on database/sql; see
// [ProcessMessagesTx] and [BeginFunc]. h is called once per batch with the
// messages that are new, in their order in the batch, and not at all when
// every one is a duplicate. If msg fails for any message, the returned
// function fails the whole batch with a *BatchKeyError matching
// ErrInvalidKey that names the message's index, before anything is sent.
func WrapMessagesTx[M, T any](m *Middleware, msg func(M) (Message, error), begin BeginFunc[T], h func(ctx context.Context, tx T, msgs []M) error) func(ctx context.Context, msgs []M) ([]Outcome, error) {
	return func(ctx context.Context, vs []M) ([]Outcome, error) {
		if len(vs) == 0 {
			return nil, nil
		}
		if msg == nil || begin == nil || h == nil {
			return nil, m.batchFailed(ctx, errors.New("idempotent: WrapMessagesTx: nil message function, begin or handler"))
		}
		msgs, err := messagesOf(ctx, m, msg, vs)
		if err != nil {
			return nil, err
		}
		return ProcessMessagesTx(ctx, m, msgs, begin, func(ctx context.Context, tx T, fresh []int) error {
			return h(ctx, tx, pick(vs, fresh))
		})
	}
}

// beginTx begins one attempt's transaction.
func (r *runner) beginTx(ctx context.Context) (*sql.Tx, error) {
	if r.begin != nil {
		return r.begin(ctx, r.db, r.txOpts)
	}
	return r.db.BeginTx(ctx, r.txOpts)
}
