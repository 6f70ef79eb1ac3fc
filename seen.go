package idempotent

import (
	"container/list"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// Seen is a duplicate pre-check: a fast record of message keys whose claims
// have committed, consulted before a transaction is opened, so that a storm
// of redeliveries or a replay of old messages does not open one transaction
// per duplicate. It is optional (WithSeen) and can only make a duplicate
// cheaper: the claim in the database stays the authority.
//
//   - Seen reports whether key was recorded in scope and has not expired.
//     A true answer makes ProcessMessage return Duplicate without touching the
//     database, so it must never be true for a key that was not recorded
//     in that scope. A miss, or any failure of the store, must answer
//     false: the message then goes to the claim as usual.
//   - Record is called only after the key's claim committed (Applied), or
//     was found committed (Duplicate). ttl is the retention window: an entry
//     must expire no later than ttl after Record, so that it never outlives
//     the claim it stands for. Record may drop entries at any time (an
//     evicting cache); failures are ignored.
//
// Entries are scoped by SeenScope: the claim table's database (as its
// dialect names it, see dialect.Identifier), the table and the consumer. A
// key recorded in one scope is not seen in another, so Middlewares with one
// consumer name on different tables, databases or servers — tenants,
// staging and production sharing one Redis — can share one Seen. Methods
// must be safe for concurrent use and should return quickly; they are
// called on the goroutine that called ProcessMessage.
//
// # When a Duplicate from the pre-check is safe
//
// The pre-check answers from what the claims were when it recorded them,
// not from what the database holds now. Its Duplicate is harmless where
// the message was already settled at the broker, so that a redelivery is
// one the broker sends anyway (at-least-once) and skipping it loses
// nothing. It is not where a consumer re-reads messages on purpose from a
// position stored in the claim's database: after a restore that position
// is older, and the messages after it must be applied again, which the
// pre-check would answer Duplicate for. The Kafka consumers therefore do not
// consult it. The pre-check never moves a stored position nor acknowledges
// a message on its own: a Duplicate it answers is returned to the caller
// like any other, who acknowledges as usual.
//
// A restore of the claim database to an earlier point loses the claims of
// everything committed after that point, while the pre-check still knows
// them. Where the restore gives the database a new identity (a Postgres
// point-in-time restore or failover starts a new timeline; a claim table
// restored from a dump is a new table), a Middleware that reads the
// identity afresh uses a new scope and finds nothing from before. A
// Middleware reads it once, on its first pre-check, so a process that
// runs on through a restore keeps the old scope: restart the consumers
// after restoring the claim database, and where the identity does not
// change (see each dialect's Identity) clear the pre-check's store too.
// docs/operations.md ("Pre-check and restores") has the procedure.
type Seen interface {
	Seen(ctx context.Context, scope SeenScope, key string) bool
	Record(ctx context.Context, scope SeenScope, key string, ttl time.Duration)
}

// SeenBatch is implemented by a Seen that can answer and record many keys
// in one call: one round trip to a shared store for a whole batch instead of
// one per key. ProcessMessages (and ProcessMessagesTx, WrapMessages,
// WrapMessagesTx) use it when the Seen has it, and Seen and Record key by
// key otherwise (SeenBatchOf). Its answers follow the rules of Seen and
// Record, key by key.
type SeenBatch interface {
	Seen
	// SeenKeys reports, for each of keys, what Seen would: a slice as long
	// as keys. A failure of the store answers false for every key.
	SeenKeys(ctx context.Context, scope SeenScope, keys []string) []bool
	// RecordKeys records every one of keys, as Record would.
	RecordKeys(ctx context.Context, scope SeenScope, keys []string, ttl time.Duration)
}

// SeenBatchOf returns s as a SeenBatch, the one way the batch entry points
// consult a pre-check, here and in the driver packages (idempgx): its
// SeenKeys and RecordKeys are s's own when s is a SeenBatch, else Seen and
// Record key by key. An answer of s's own SeenKeys that is not one per key
// counts as a miss for every key. It returns nil for a nil s.
func SeenBatchOf(s Seen) SeenBatch {
	if s == nil {
		return nil
	}
	return seenBatch{s}
}

// seenBatch is SeenBatchOf's SeenBatch.
type seenBatch struct{ s Seen }

func (b seenBatch) Seen(ctx context.Context, scope SeenScope, key string) bool {
	return b.s.Seen(ctx, scope, key)
}

func (b seenBatch) Record(ctx context.Context, scope SeenScope, key string, ttl time.Duration) {
	b.s.Record(ctx, scope, key, ttl)
}

func (b seenBatch) SeenKeys(ctx context.Context, scope SeenScope, keys []string) []bool {
	if sb, ok := b.s.(SeenBatch); ok {
		if hit := sb.SeenKeys(ctx, scope, keys); len(hit) == len(keys) {
			return hit
		}
		return make([]bool, len(keys))
	}
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = b.s.Seen(ctx, scope, k)
	}
	return hit
}

func (b seenBatch) RecordKeys(ctx context.Context, scope SeenScope, keys []string, ttl time.Duration) {
	if len(keys) == 0 {
		return
	}
	if sb, ok := b.s.(SeenBatch); ok {
		sb.RecordKeys(ctx, scope, keys, ttl)
		return
	}
	for _, k := range keys {
		b.s.Record(ctx, scope, k, ttl)
	}
}

// SeenScope is the scope of a pre-check's entries (see Seen): a key
// recorded in one scope is seen in no other. A Middleware's scope is
// returned by Middleware.SeenScope.
type SeenScope struct {
	// Database names the claim table's database as its dialect reads it
	// (dialect.Identifier): for Postgres the cluster's system identifier,
	// its timeline, the database and the table's OID; for MySQL and
	// MariaDB the server's identifier, host and port, and the table's
	// database and creation time; for SQLite the database file's path.
	Database string
	// Table is the claim table, as configured (WithTable).
	Table string
	// Consumer is the consumer name.
	Consumer string
}

// String returns the scope as one text, each field preceded by its length
// and a colon: two scopes have the same text only if they are equal, so a
// store can key its entries by it.
func (s SeenScope) String() string {
	var b strings.Builder
	b.Grow(len(s.Database) + len(s.Table) + len(s.Consumer) + 16)
	for _, f := range [...]string{s.Database, s.Table, s.Consumer} {
		b.WriteString(strconv.Itoa(len(f)))
		b.WriteByte(':')
		b.WriteString(f)
	}
	return b.String()
}

// ErrNoSeenScope is returned, wrapped, by Middleware.SeenScope when the
// claim table's database cannot be named: the dialect does not implement
// dialect.Identifier, or its query failed (the claim table does not exist
// yet, the server refuses the query, an in-memory SQLite database). The
// pre-check is then left out: every delivery goes to the claim.
var ErrNoSeenScope = errors.New("idempotent: the claim table's database cannot be named, so the pre-check is left out")

// WithSeen sets a duplicate pre-check (see Seen), consulted by
// ProcessMessage, ProcessMessages, ProcessMessageTx, ProcessMessagesTx and
// the Wrap functions after
// the messages are validated and before a transaction is opened: a message
// it knows is a Duplicate without touching the database, and a batch it
// knows whole opens no transaction. Its entries are scoped by
// Middleware.SeenScope, which the first delivery reads from the database
// (one query); while it cannot be read the pre-check is left out, and it is
// read again at most every 10 seconds. Call SeenScope after EnsureSchema
// to learn at start whether the pre-check runs. New refuses WithSeen on a
// dialect that does not implement dialect.Identifier. Default is none:
// every delivery goes to the database.
func WithSeen(s Seen) Option {
	return optionFunc(func(c *config) error {
		if s == nil {
			return errors.New("idempotent: WithSeen: nil Seen")
		}
		c.seen = s
		return nil
	})
}

// checkSeen refuses a pre-check on a dialect that cannot name its
// database: its entries would have no scope but the table and consumer.
func checkSeen(s Seen, d dialect.Dialect) error {
	if _, ok := d.(dialect.Identifier); s != nil && !ok {
		return fmt.Errorf("idempotent: WithSeen: the %s dialect cannot name its database (it does not implement dialect.Identifier), so the pre-check's entries could not be kept apart from other databases'", d.Name())
	}
	return nil
}

// SeenScope returns the scope of the Middleware's pre-check entries: the
// claim table's database as the dialect names it (dialect.Identifier), the
// table and the consumer. It reads the name from the database on the first
// call — the pre-check's first use calls it too — and returns it from
// memory afterwards, for the Middleware's lifetime. Until a read succeeds
// it returns an error wrapping ErrNoSeenScope, reading again at most every
// 10 seconds; a caller that finds a read under way waits for it. It works
// with or without WithSeen.
func (m *Middleware) SeenScope(ctx context.Context) (SeenScope, error) {
	return m.seenScope.Get(ctx, m.readSeenScope)
}

// readSeenScope reads the Middleware's SeenScope from the database.
func (m *Middleware) readSeenScope(ctx context.Context) (SeenScope, error) {
	id, ok := m.d.(dialect.Identifier)
	if !ok {
		return SeenScope{}, fmt.Errorf("%w: the %s dialect cannot name its database (dialect.Identifier)", ErrNoSeenScope, m.d.Name())
	}
	name, err := id.Identity(ctx, m.table, func(ctx context.Context, query string, args ...any) (string, error) {
		var s sql.NullString
		err := m.db.QueryRowContext(ctx, query, args...).Scan(&s)
		return s.String, err
	})
	if err == nil && name == "" {
		err = fmt.Errorf("the %s dialect named the database %q", m.d.Name(), name)
	}
	if err != nil {
		return SeenScope{}, fmt.Errorf("%w: consumer %q, table %s: %w", ErrNoSeenScope, m.consumer, m.table, err)
	}
	return SeenScope{Database: name, Table: m.table.String(), Consumer: m.consumer}, nil
}

// seenBefore reports whether the pre-check, if any, already knows key.
// Without a pre-check, or while its scope cannot be read, it is false: the
// pre-check is left out.
func (m *Middleware) seenBefore(ctx context.Context, key string) bool {
	if m.seen == nil {
		return false
	}
	scope, err := m.SeenScope(ctx)
	return err == nil && m.seen.Seen(ctx, scope, key)
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	if m.seen == nil {
		return nil
	}
	scope, err := m.SeenScope(ctx)
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
	if scope, err := m.SeenScope(ctx); err == nil {
		m.seenBatch.RecordKeys(ctx, scope, keys, m.ret.window)
	}
}

// recordSeen tells the pre-check, if any, that key's claim is committed.
func (m *Middleware) recordSeen(ctx context.Context, key string) {
	if m.seen == nil {
		return
	}
	if scope, err := m.SeenScope(ctx); err == nil {
		m.seen.Record(ctx, scope, key, m.ret.window)
	}
}

// SeenLRU is an in-process Seen: a bounded map of the most recently recorded
// keys, evicting the least recently used beyond its capacity, each entry
// expiring ttl after it was recorded. It is safe for concurrent use. Being
// in-process, it only knows what this process recorded: share one per
// process among the Middlewares of all consumers, tables and databases
// (their entries are kept apart by scope, see Seen), or use a shared store
// such as the seenredis package for a fleet.
type SeenLRU struct {
	mu    sync.Mutex
	cap   int
	now   func() time.Time
	items map[seenKey]*list.Element
	order list.List // front: most recently used
}

type seenKey struct {
	scope SeenScope
	key   string
}

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

// Seen reports whether key was recorded in scope and has not expired.
func (s *SeenLRU) Seen(_ context.Context, scope SeenScope, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[seenKey{scope, key}]
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

// Record remembers key in scope for ttl, evicting the least recently used
// key when full. A ttl that is not positive records nothing.
func (s *SeenLRU) Record(_ context.Context, scope SeenScope, key string, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	k := seenKey{scope, key}
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

// SeenKeys reports, for each of keys, whether it was recorded in scope and
// has not expired.
func (s *SeenLRU) SeenKeys(ctx context.Context, scope SeenScope, keys []string) []bool {
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = s.Seen(ctx, scope, k)
	}
	return hit
}

// RecordKeys records every one of keys in scope for ttl, as Record does.
func (s *SeenLRU) RecordKeys(ctx context.Context, scope SeenScope, keys []string, ttl time.Duration) {
	for _, k := range keys {
		s.Record(ctx, scope, k, ttl)
	}
}

// Len returns how many keys are held, expired ones included until they are
// looked up or evicted.
func (s *SeenLRU) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}
