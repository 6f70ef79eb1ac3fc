package idempgx

import (
	"context"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/seencheck"
)

// The duplicate pre-check (WithSeen), scoped as the core's: by the scope
// the core Middleware on the same pool reads once (idempotent.Middleware's
// SeenScope), so that a pgx Middleware and a database/sql one of the same
// consumer and table share their entries, and no other does.

// preCheck returns the pre-check's scope, and false when there is no
// pre-check or its scope cannot be read (the pre-check is then left out).
func (m *Middleware) preCheck(ctx context.Context) (idempotent.SeenScope, bool) {
	if m.seen == nil {
		return idempotent.SeenScope{}, false
	}
	scope, err := m.core.SeenScope(ctx)
	return scope, err == nil
}

// seenBefore reports whether the pre-check, if any, already knows key.
func (m *Middleware) seenBefore(ctx context.Context, key string) bool {
	scope, ok := m.preCheck(ctx)
	return ok && m.seen.Seen(ctx, scope, key)
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	scope, ok := m.preCheck(ctx)
	if !ok {
		return nil
	}
	return seencheck.Keys[idempotent.SeenScope](ctx, m.seen, scope, keys)
}

// recordSeen tells the pre-check, if any, that keys' claims are committed.
func (m *Middleware) recordSeen(ctx context.Context, keys ...string) {
	if scope, ok := m.preCheck(ctx); ok {
		seencheck.Record[idempotent.SeenScope](ctx, m.seen, scope, keys, m.retention)
	}
}
