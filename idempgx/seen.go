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

// seenBefore reports whether the pre-check, if any, already knows key.
func (m *Middleware) seenBefore(ctx context.Context, key string) bool {
	return seencheck.Before[idempotent.SeenScope](ctx, m.seen, m.core, key)
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	return seencheck.Known[idempotent.SeenScope](ctx, m.seen, m.core, keys)
}

// recordSeenKeys tells the pre-check, if any, that keys' claims are
// committed.
func (m *Middleware) recordSeenKeys(ctx context.Context, keys []string) {
	seencheck.After[idempotent.SeenScope](ctx, m.seen, m.core, keys, m.retention)
}

// recordSeen tells the pre-check, if any, that key's claim is committed.
func (m *Middleware) recordSeen(ctx context.Context, key string) {
	if m.seen == nil {
		return
	}
	if scope, err := m.core.SeenScope(ctx); err == nil {
		m.seen.Record(ctx, scope, key, m.retention)
	}
}
