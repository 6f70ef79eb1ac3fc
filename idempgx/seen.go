package idempgx

import (
	"context"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// The duplicate pre-check (WithSeen), scoped as the core's: by the scope
// the core Middleware on the same pool reads (idempotent.Middleware's
// SeenScope, read again when it has aged), so that a pgx Middleware and a
// database/sql one of the same consumer and table share their entries,
// and no other does. A call reads the scope before its transaction begins
// and records its keys in that scope; a lost connection makes the core
// forget it. A batch is asked and recorded as the core's are, through
// idempotent.SeenBatchOf.

// preCheckScope returns the scope the pre-check answers from for a call
// about to claim, read before its transaction begins: its keys are
// recorded in it once their claims committed. It is the zero SeenScope,
// which records nothing, without a pre-check or while it is left out.
func (m *Middleware) preCheckScope(ctx context.Context) idempotent.SeenScope {
	if m.seen == nil {
		return idempotent.SeenScope{}
	}
	scope, err := m.core.SeenScope(ctx)
	if err != nil {
		return idempotent.SeenScope{}
	}
	return scope
}

// seenBefore reports whether the pre-check knows key in scope.
func (m *Middleware) seenBefore(ctx context.Context, scope idempotent.SeenScope, key string) bool {
	return scope.Database != "" && m.seen.Seen(ctx, scope, key)
}

// seenKeys reports which of keys the pre-check knows in scope: nil when
// there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, scope idempotent.SeenScope, keys []string) []bool {
	if scope.Database == "" {
		return nil
	}
	return m.seenBatch.SeenKeys(ctx, scope, keys)
}

// recordSeenKeys tells the pre-check that keys' claims are committed, in
// the scope read before their transaction began.
func (m *Middleware) recordSeenKeys(ctx context.Context, scope idempotent.SeenScope, keys []string) {
	if scope.Database != "" && len(keys) > 0 {
		m.seenBatch.RecordKeys(ctx, scope, keys, m.retention)
	}
}

// recordSeen tells the pre-check that key's claim is committed, in the
// scope read before its transaction began.
func (m *Middleware) recordSeen(ctx context.Context, scope idempotent.SeenScope, key string) {
	if scope.Database != "" {
		m.seen.Record(ctx, scope, key, m.retention)
	}
}

// lostConnection passes an attempt's result on, and makes the core forget
// the pre-check's scope when the attempt lost its connection.
func (m *Middleware) lostConnection(class dialect.Class, err error) (dialect.Class, error) {
	if class.Kind == dialect.KindConnection {
		m.core.ForgetSeenScope()
	}
	return class, err
}
