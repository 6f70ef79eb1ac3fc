package seencheck

import (
	"context"
	"slices"
	"testing"
	"time"
)

// one answers and records key by key.
type one struct {
	known    map[string]bool
	recorded []string
}

func (o *one) Seen(_ context.Context, _, key string) bool { return o.known[key] }
func (o *one) Record(_ context.Context, _, key string, _ time.Duration) {
	o.recorded = append(o.recorded, key)
}

// many answers and records batches, or answers with the wrong length.
type many struct {
	one
	calls int
	wrong bool
}

func (m *many) SeenKeys(ctx context.Context, consumer string, keys []string) []bool {
	m.calls++
	if m.wrong {
		return []bool{true}
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = m.one.Seen(ctx, consumer, k)
	}
	return out
}

func (m *many) RecordKeys(ctx context.Context, consumer string, keys []string, ttl time.Duration) {
	m.calls++
	for _, k := range keys {
		m.one.Record(ctx, consumer, k, ttl)
	}
}

func TestKeysAndRecord(t *testing.T) {
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	known := map[string]bool{"b": true}
	o := &one{known: known}
	if got := Keys(ctx, o, "c", keys); !slices.Equal(got, []bool{false, true, false}) {
		t.Fatalf("key by key: %v", got)
	}
	m := &many{one: one{known: known}}
	if got := Keys(ctx, m, "c", keys); !slices.Equal(got, []bool{false, true, false}) || m.calls != 1 {
		t.Fatalf("a batch: %v in %d calls, want one call", got, m.calls)
	}
	m.wrong = true
	if got := Keys(ctx, m, "c", keys); slices.Contains(got, true) || len(got) != 3 {
		t.Fatalf("an answer of the wrong length: %v, want three misses", got)
	}
	Record(ctx, m, "c", keys, time.Hour)
	Record(ctx, o, "c", keys, time.Hour)
	Record(ctx, o, "c", nil, time.Hour)
	if m.calls != 3 || !slices.Equal(m.recorded, keys) || !slices.Equal(o.recorded, keys) {
		t.Fatalf("recorded %v (%d calls) and %v", m.recorded, m.calls, o.recorded)
	}
}

func TestUnknown(t *testing.T) {
	keys, first := Unknown([]bool{true, false, true, false}, []string{"a", "b", "c", "d"}, []int{3, 0, 2, 1})
	if !slices.Equal(keys, []string{"b", "d"}) || !slices.Equal(first, []int{0, 1}) {
		t.Fatalf("Unknown = %v, %v; want [b d], [0 1]", keys, first)
	}
}
