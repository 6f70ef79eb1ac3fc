// Package idemsqlx runs handlers written against github.com/jmoiron/sqlx's
// *sqlx.Tx under the idempotent middleware, so they can use named queries,
// Get and Select inside the claim's transaction:
//
//	db := sqlx.NewDb(sqlDB, "postgres")
//	mw, err := idempotent.New(sqlDB, postgres.New(), "loyalty")
//	…
//	handle := idemsqlx.Wrap(mw, db, orderKey, func(ctx context.Context, tx *sqlx.Tx, o OrderCompleted) error {
//		_, err := tx.NamedExecContext(ctx, `UPDATE balances SET points = points + :points WHERE customer_id = :customer_id`, o)
//		return err
//	})
//	outcome, err := handle(ctx, msg)
//
// Each attempt's transaction is begun with db.BeginTxx, so the *sqlx.Tx
// binds parameters for db's driver name and maps fields with db's Mapper.
// Claim, retries, guard and observer are the Middleware's
// (idempotent.ProcessMessageTx); ProcessMessages claims a batch in one
// transaction (idempotent.ProcessMessagesTx).
package idemsqlx

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/txclaim/idempotent"
)

// ErrOtherDB is returned, wrapped, when the *sqlx.DB given to Process or
// Wrap does not wrap the *sql.DB the Middleware was created with: claim and
// effect would run in different transactions. Nothing was written.
var ErrOtherDB = errors.New("idemsqlx: the *sqlx.DB does not wrap the Middleware's *sql.DB")

// TxFunc is work run inside the claim's transaction. It must do all its
// database work through tx and with ctx, and must not commit or roll back
// tx.
type TxFunc func(ctx context.Context, tx *sqlx.Tx) error

// Handler applies one message's effect inside the claim's transaction.
type Handler[M any] func(ctx context.Context, tx *sqlx.Tx, msg M) error

// BatchFunc applies the effects of a batch's new messages inside the
// transaction that claimed them; fresh holds their indexes in the batch, in
// ascending order, and is never empty (see idempotent.BatchFunc).
type BatchFunc func(ctx context.Context, tx *sqlx.Tx, fresh []int) error

// Begin returns the idempotent.BeginFunc that begins each attempt's
// transaction with db.BeginTxx. db must wrap the Middleware's *sql.DB;
// otherwise the attempt fails with ErrOtherDB before anything is sent.
func Begin(db *sqlx.DB) idempotent.BeginFunc[*sqlx.Tx] {
	return func(ctx context.Context, mwDB *sql.DB, opts *sql.TxOptions) (*sqlx.Tx, *sql.Tx, error) {
		if db == nil || db.DB != mwDB {
			return nil, nil, ErrOtherDB
		}
		tx, err := db.BeginTxx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		return tx, tx.Tx, nil
	}
}

// Process is ProcessMessage for a message known by its key alone.
func Process(ctx context.Context, mw *idempotent.Middleware, db *sqlx.DB, key string, fn TxFunc) (idempotent.Outcome, error) {
	return ProcessMessage(ctx, mw, db, idempotent.Message{Key: key}, fn)
}

// ProcessMessage is Middleware.ProcessMessage for fn on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB: msg's event time, when it has
// one, works as there (the retention fence, partitioned mode).
func ProcessMessage(ctx context.Context, mw *idempotent.Middleware, db *sqlx.DB, msg idempotent.Message, fn TxFunc) (idempotent.Outcome, error) {
	if fn == nil {
		return 0, errors.New("idemsqlx: Process: nil function")
	}
	return idempotent.ProcessMessageTx(ctx, mw, msg, Begin(db), fn)
}

// ProcessMessages is Middleware.ProcessMessages for fn on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB: the messages are claimed
// together in one transaction and fn runs once for the new ones
// (idempotent.ProcessMessagesTx).
func ProcessMessages(ctx context.Context, mw *idempotent.Middleware, db *sqlx.DB, msgs []idempotent.Message, fn BatchFunc) ([]idempotent.Outcome, error) {
	if fn == nil {
		return nil, errors.New("idemsqlx: ProcessMessages: nil function")
	}
	return idempotent.ProcessMessagesTx(ctx, mw, msgs, Begin(db), fn)
}

// Wrap is idempotent.Wrap for a handler on a *sqlx.Tx of db, which must
// wrap the Middleware's *sql.DB. If key fails, the returned function
// returns an error matching idempotent.ErrInvalidKey without opening a
// transaction.
func Wrap[M any](mw *idempotent.Middleware, db *sqlx.DB, key func(M) (string, error), h Handler[M]) func(ctx context.Context, msg M) (idempotent.Outcome, error) {
	if key == nil {
		return WrapMessage[M](mw, db, nil, h)
	}
	return WrapMessage(mw, db, func(msg M) (idempotent.Message, error) {
		k, err := key(msg)
		return idempotent.Message{Key: k}, err
	}, h)
}

// WrapMessage is idempotent.WrapMessage for a handler on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB. msg returns the message's key
// and, when it has one, its event time. If msg fails, the returned function
// returns an error matching idempotent.ErrInvalidKey without opening a
// transaction.
func WrapMessage[M any](mw *idempotent.Middleware, db *sqlx.DB, msg func(M) (idempotent.Message, error), h Handler[M]) func(ctx context.Context, msg M) (idempotent.Outcome, error) {
	return idempotent.WrapMessageTx(mw, Begin(db), msg, h)
}
