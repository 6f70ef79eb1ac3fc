// Package idemsqlx runs handlers written against github.com/jmoiron/sqlx's
// *sqlx.Tx under the idempotent middleware, so they can use named queries,
// Get and Select inside the claim's transaction:
//
//	db := sqlx.NewDb(sqlDB, "postgres")
//	mw, err := idempotent.New(sqlDB, postgres.New(), "loyalty")
//	…
//	handle := idemsqlx.WrapMessage(mw, orderMessage, db, func(ctx context.Context, tx *sqlx.Tx, o OrderCompleted) error {
//		_, err := tx.NamedExecContext(ctx, `UPDATE balances SET points = points + :points WHERE customer_id = :customer_id`, o)
//		return err
//	})
//	outcome, err := handle(ctx, msg)
//
// Each attempt's transaction is begun with db.BeginTxx, so the *sqlx.Tx
// binds parameters for db's driver name and maps fields with db's Mapper.
// Claim, retention fence, retries, guard and observer are the
// Middleware's: ProcessMessage and WrapMessage are idempotent.ProcessMessageTx
// and idempotent.WrapMessageTx with [Begin]; ProcessMessages and
// WrapMessages claim a batch in one transaction (idempotent.ProcessMessagesTx,
// idempotent.WrapMessagesTx). The arguments come in the core's order, db
// where the core takes its begin function: ctx, the Middleware, the
// message (or messages), db, the function.
package idemsqlx

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/txclaim/idempotent"
)

// ErrOtherDB is returned, wrapped, when the *sqlx.DB given to an entry
// point does not wrap the *sql.DB the Middleware was created with: claim and
// effect would run in different transactions. Nothing was written.
var ErrOtherDB = errors.New("idemsqlx: the *sqlx.DB does not wrap the Middleware's *sql.DB")

// TxFunc is work run inside the claim's transaction. It must do all its
// database work through tx and with ctx, and must not commit or roll back
// tx.
type TxFunc func(ctx context.Context, tx *sqlx.Tx) error

// Handler applies one message's effect inside the claim's transaction.
type Handler[M any] func(ctx context.Context, tx *sqlx.Tx, msg M) error

// BatchHandler applies the effects of a batch's new messages, given in
// their order in the batch, inside the transaction that claimed them (see
// idempotent.BatchHandler).
type BatchHandler[M any] func(ctx context.Context, tx *sqlx.Tx, msgs []M) error

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

// ProcessMessage is Middleware.ProcessMessage for fn on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB: msg's event time, when it has
// one, works as there (the retention fence, partitioned mode).
func ProcessMessage(ctx context.Context, mw *idempotent.Middleware, msg idempotent.Message, db *sqlx.DB, fn TxFunc) (idempotent.Outcome, error) {
	if fn == nil {
		return 0, errors.New("idemsqlx: ProcessMessage: nil function")
	}
	return idempotent.ProcessMessageTx(ctx, mw, msg, Begin(db), fn)
}

// ProcessMessages is Middleware.ProcessMessages for fn on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB: the messages are claimed
// together in one transaction and fn runs once for the new ones
// (idempotent.ProcessMessagesTx).
func ProcessMessages(ctx context.Context, mw *idempotent.Middleware, msgs []idempotent.Message, db *sqlx.DB, fn BatchFunc) ([]idempotent.Outcome, error) {
	if fn == nil {
		return nil, errors.New("idemsqlx: ProcessMessages: nil function")
	}
	return idempotent.ProcessMessagesTx(ctx, mw, msgs, Begin(db), fn)
}

// WrapMessage is idempotent.WrapMessage for a handler on a *sqlx.Tx of db,
// which must wrap the Middleware's *sql.DB. msg returns the message's key
// and, when it has one, its event time. If msg fails, the returned function
// returns an error matching idempotent.ErrInvalidKey without opening a
// transaction.
func WrapMessage[M any](mw *idempotent.Middleware, msg func(M) (idempotent.Message, error), db *sqlx.DB, h Handler[M]) func(ctx context.Context, msg M) (idempotent.Outcome, error) {
	return idempotent.WrapMessageTx(mw, msg, Begin(db), h)
}

// WrapMessages is idempotent.WrapMessages for a handler on a *sqlx.Tx of
// db, which must wrap the Middleware's *sql.DB: h runs once per batch with
// its new messages, in one transaction. If msg fails for any message, the
// returned function fails the whole batch with an
// *idempotent.BatchKeyError matching idempotent.ErrInvalidKey, before
// anything is sent.
func WrapMessages[M any](mw *idempotent.Middleware, msg func(M) (idempotent.Message, error), db *sqlx.DB, h BatchHandler[M]) func(ctx context.Context, msgs []M) ([]idempotent.Outcome, error) {
	return idempotent.WrapMessagesTx(mw, msg, Begin(db), h)
}
