package idempgx

import "context"

// The duplicate pre-check (WithSeen), scoped as the core's: by the scope
// the core Middleware on the same pool reads once (idempotent.Middleware's
// SeenScope), so that a pgx Middleware and a database/sql one of the same
// consumer and table share their entries, and no other does. A batch is
// asked and recorded as the core's are, through idempotent.SeenBatchOf.

// seenBefore reports whether the pre-check, if any, already knows key.
func (m *Middleware) seenBefore(ctx context.Context, key string) bool {
	if m.seen == nil {
		return false
	}
	scope, err := m.core.SeenScope(ctx)
	return err == nil && m.seen.Seen(ctx, scope, key)
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	if m.seen == nil {
		return nil
	}
	scope, err := m.core.SeenScope(ctx)
	if err != nil {
		return nil
	}
	return m.seenBatch.SeenKeys(ctx, scope, keys)
}

// recordSeenKeys tells the pre-check, if any, that keys' claims are
// committed.
func (m *Middleware) recordSeenKeys(ctx context.Context, keys []string) {
	if m.seen == nil || len(keys) == 0 {
		return
	}
	if scope, err := m.core.SeenScope(ctx); err == nil {
		m.seenBatch.RecordKeys(ctx, scope, keys, m.retention)
	}
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

// unknown keeps, in place, the keys whose hit is false and the entries of
// first at the same positions, and returns both shortened.
func unknown(hit []bool, keys []string, first []int) ([]string, []int) {
	n := 0
	for j := range keys {
		if !hit[j] {
			keys[n], first[n] = keys[j], first[j]
			n++
		}
	}
	return keys[:n], first[:n]
}
