package idempotent

import (
	"context"
	"database/sql"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// The entry points below are kept for one release; each is one call of the
// Message form that replaced it.

// ProcessEvent is ProcessMessage for a message that carries its event time;
// a zero eventTime is refused with ErrInvalidEventTime.
//
// Deprecated: use ProcessMessage with Message{Key: key, EventTime: eventTime}.
func (m *Middleware) ProcessEvent(ctx context.Context, key string, eventTime time.Time, fn TxFunc) (Outcome, error) {
	return m.processMessage(ctx, &m.run, Message{Key: key, EventTime: eventTime}, eventTimeRequired, fn)
}

// ClaimEvent is ClaimMessage for a message that carries its event time; a
// zero eventTime is refused with ErrInvalidEventTime.
//
// Deprecated: use ClaimMessage with Message{Key: key, EventTime: eventTime}.
func (m *Middleware) ClaimEvent(ctx context.Context, tx *sql.Tx, key string, eventTime time.Time) (claimed bool, err error) {
	return m.claimMessage(ctx, tx, Message{Key: key, EventTime: eventTime}, eventTimeRequired)
}

// WrapEvent is WrapMessage for messages that carry their event time: key
// returns the message's stable identity and its producer-assigned event
// time, and a zero event time is refused with ErrInvalidEventTime.
//
// Deprecated: use WrapMessage, whose function returns a Message.
func WrapEvent[M any](m *Middleware, key func(M) (string, time.Time, error), h Handler[M]) func(ctx context.Context, msg M) (Outcome, error) {
	return wrapMessage(m, eventKey(key), eventTimeRequired, h)
}

// ProcessTx is ProcessMessageTx for a message known by its key alone.
//
// Deprecated: use ProcessMessageTx with Message{Key: key}.
func ProcessTx[T any](ctx context.Context, m *Middleware, key string, begin BeginFunc[T], fn func(ctx context.Context, tx T) error) (Outcome, error) {
	return ProcessMessageTx(ctx, m, Message{Key: key}, begin, fn)
}

// WrapTx is WrapMessageTx for messages known by their key alone.
//
// Deprecated: use WrapMessageTx, whose function returns a Message.
func WrapTx[M, T any](m *Middleware, begin BeginFunc[T], key func(M) (string, error), h func(ctx context.Context, tx T, msg M) error) func(ctx context.Context, msg M) (Outcome, error) {
	return WrapMessageTx(m, begin, keyOnly(key), h)
}

// eventKey turns WrapEvent's key function into a Message function.
func eventKey[M any](key func(M) (string, time.Time, error)) func(M) (Message, error) {
	if key == nil {
		return nil
	}
	return func(msg M) (Message, error) {
		k, at, err := key(msg)
		return Message{Key: k, EventTime: at}, err
	}
}

// VersionedUpsert describes a version-guarded upsert.
//
// Deprecated: use dialect.VersionedUpsert; the upsert builder is SQL
// building and lives with the dialects.
type VersionedUpsert = dialect.VersionedUpsert

// Upsert is a prepared version-guarded upsert.
//
// Deprecated: use dialect.Upsert.
type Upsert = dialect.Upsert

// Execer runs a statement: *sql.DB, *sql.Tx and *sql.Conn all are.
//
// Deprecated: use dialect.Execer.
type Execer = dialect.Execer

// NewVersionedUpsert checks u and builds its statement for dialect d.
//
// Deprecated: use dialect.NewVersionedUpsert.
func NewVersionedUpsert(d dialect.Dialect, u VersionedUpsert) (*Upsert, error) {
	return dialect.NewVersionedUpsert(d, u)
}
