package idempotent

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/txclaim/idempotent/internal/seencheck"
)

// Seen is a duplicate pre-check: a fast record of message keys whose claims
// have committed, consulted before a transaction is opened, so that a storm
// of redeliveries or a replay of old messages does not open one transaction
// per duplicate. It is optional (WithSeen) and can only make a duplicate
// cheaper: the claim in the database stays the authority.
//
//   - Seen reports whether key was recorded for consumer and has not
//     expired. A true answer makes Process return Duplicate without touching
//     the database, so it must never be true for a key that was not
//     recorded. A miss, or any failure of the store, must answer false: the
//     message then goes to the claim as usual.
//   - Record is called only after the key's claim committed (Applied), or
//     was found committed (Duplicate). ttl is the retention window: an entry
//     must expire no later than ttl after Record, so that it never outlives
//     the claim it stands for. Record may drop entries at any time (an
//     evicting cache); failures are ignored.
//
// Entries are scoped by consumer: the same key recorded for one consumer is
// not seen by another. Methods must be safe for concurrent use and should
// return quickly; they are called on the goroutine that called Process.
type Seen interface {
	Seen(ctx context.Context, consumer, key string) bool
	Record(ctx context.Context, consumer, key string, ttl time.Duration)
}

// SeenBatch is implemented by a Seen that can answer and record many keys
// in one call: one round trip to a shared store for a whole batch instead of
// one per key. ProcessMessages (and ProcessBatch, WrapMessages, WrapBatch)
// use it when the Seen has it, and Seen and Record key by key otherwise.
// Its answers follow the rules of Seen and Record, key by key.
type SeenBatch interface {
	Seen
	// SeenKeys reports, for each of keys, what Seen would: a slice as long
	// as keys. A failure of the store answers false for every key.
	SeenKeys(ctx context.Context, consumer string, keys []string) []bool
	// RecordKeys records every one of keys, as Record would.
	RecordKeys(ctx context.Context, consumer string, keys []string, ttl time.Duration)
}

// WithSeen sets a duplicate pre-check (see Seen), consulted by Process,
// ProcessMessage, ProcessMessages, ProcessTx and the Wrap functions after
// the messages are validated and before a transaction is opened: a message
// it knows is a Duplicate without touching the database, and a batch it
// knows whole opens no transaction. Default is none: every delivery goes to
// the database.
func WithSeen(s Seen) Option {
	return optionFunc(func(c *config) error {
		if s == nil {
			return errors.New("idempotent: WithSeen: nil Seen")
		}
		c.seen = s
		return nil
	})
}

// seenBefore reports whether the pre-check, if any, already knows key.
func (m *Middleware) seenBefore(ctx context.Context, key string) bool {
	return m.seen != nil && m.seen.Seen(ctx, m.consumer, key)
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is no pre-check.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	if m.seen == nil {
		return nil
	}
	return seencheck.Keys(ctx, m.seen, m.consumer, keys)
}

// recordSeenKeys tells the pre-check, if any, that keys' claims are
// committed.
func (m *Middleware) recordSeenKeys(ctx context.Context, keys []string) {
	if m.seen != nil {
		seencheck.Record(ctx, m.seen, m.consumer, keys, m.ret.window)
	}
}

// recordSeen tells the pre-check, if any, that key's claim is committed.
func (m *Middleware) recordSeen(ctx context.Context, key string) {
	if m.seen != nil {
		m.seen.Record(ctx, m.consumer, key, m.ret.window)
	}
}

// SeenLRU is an in-process Seen: a bounded map of the most recently recorded
// keys, evicting the least recently used beyond its capacity, each entry
// expiring ttl after it was recorded. It is safe for concurrent use. Being
// in-process, it only knows what this process recorded: share one per
// process among the Middlewares of all consumers, or use a shared store such
// as the seenredis package for a fleet.
type SeenLRU struct {
	mu    sync.Mutex
	cap   int
	now   func() time.Time
	items map[seenKey]*list.Element
	order list.List // front: most recently used
}

type seenKey struct{ consumer, key string }

type seenEntry struct {
	k       seenKey
	expires time.Time
}

var _ Seen = (*SeenLRU)(nil)

// NewSeenLRU returns a SeenLRU holding at most capacity keys. capacity must
// be at least 1.
func NewSeenLRU(capacity int) (*SeenLRU, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("idempotent: NewSeenLRU: capacity %d, want at least 1", capacity)
	}
	s := &SeenLRU{cap: capacity, now: time.Now, items: make(map[seenKey]*list.Element, min(capacity, 1<<16))}
	s.order.Init()
	return s, nil
}

// Seen reports whether key was recorded for consumer and has not expired.
func (s *SeenLRU) Seen(_ context.Context, consumer, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[seenKey{consumer, key}]
	if !ok {
		return false
	}
	if !s.now().Before(e.Value.(*seenEntry).expires) {
		s.order.Remove(e)
		delete(s.items, e.Value.(*seenEntry).k)
		return false
	}
	s.order.MoveToFront(e)
	return true
}

// Record remembers key for consumer for ttl, evicting the least recently
// used key when full. A ttl that is not positive records nothing.
func (s *SeenLRU) Record(_ context.Context, consumer, key string, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	k := seenKey{consumer, key}
	s.mu.Lock()
	defer s.mu.Unlock()
	expires := s.now().Add(ttl)
	if e, ok := s.items[k]; ok {
		e.Value.(*seenEntry).expires = expires
		s.order.MoveToFront(e)
		return
	}
	if s.order.Len() >= s.cap {
		old := s.order.Back()
		s.order.Remove(old)
		delete(s.items, old.Value.(*seenEntry).k)
	}
	s.items[k] = s.order.PushFront(&seenEntry{k: k, expires: expires})
}

// SeenKeys reports, for each of keys, whether it was recorded for consumer
// and has not expired.
func (s *SeenLRU) SeenKeys(ctx context.Context, consumer string, keys []string) []bool {
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = s.Seen(ctx, consumer, k)
	}
	return hit
}

// RecordKeys records every one of keys for consumer for ttl, as Record does.
func (s *SeenLRU) RecordKeys(ctx context.Context, consumer string, keys []string, ttl time.Duration) {
	for _, k := range keys {
		s.Record(ctx, consumer, k, ttl)
	}
}

// Len returns how many keys are held, expired ones included until they are
// looked up or evicted.
func (s *SeenLRU) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}
