// Package seencheck consults a duplicate pre-check (an idempotent.Seen) for
// a batch of keys: in one call where the pre-check can answer a batch (an
// idempotent.SeenBatch), key by key otherwise. Package idempotent and the
// idempgx module share it, so that both read and record a batch the same
// way.
package seencheck

import (
	"context"
	"time"
)

// Seen is idempotent.Seen.
type Seen interface {
	Seen(ctx context.Context, consumer, key string) bool
	Record(ctx context.Context, consumer, key string, ttl time.Duration)
}

// batch is idempotent.SeenBatch less Seen.
type batch interface {
	SeenKeys(ctx context.Context, consumer string, keys []string) []bool
	RecordKeys(ctx context.Context, consumer string, keys []string, ttl time.Duration)
}

// Keys reports which of keys s knows for consumer. An answer of the wrong
// length from a batch pre-check counts as a miss for every key.
func Keys(ctx context.Context, s Seen, consumer string, keys []string) []bool {
	if b, ok := s.(batch); ok {
		if hit := b.SeenKeys(ctx, consumer, keys); len(hit) == len(keys) {
			return hit
		}
		return make([]bool, len(keys))
	}
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = s.Seen(ctx, consumer, k)
	}
	return hit
}

// Record tells s that the claims of keys for consumer are committed.
func Record(ctx context.Context, s Seen, consumer string, keys []string, ttl time.Duration) {
	if len(keys) == 0 {
		return
	}
	if b, ok := s.(batch); ok {
		b.RecordKeys(ctx, consumer, keys, ttl)
		return
	}
	for _, k := range keys {
		s.Record(ctx, consumer, k, ttl)
	}
}

// Unknown keeps, in place, the keys whose hit is false and the entries of
// first at the same positions, and returns both shortened.
func Unknown(hit []bool, keys []string, first []int) ([]string, []int) {
	n := 0
	for j := range keys {
		if !hit[j] {
			keys[n], first[n] = keys[j], first[j]
			n++
		}
	}
	return keys[:n], first[:n]
}
