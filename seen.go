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
	"github.com/txclaim/idempotent/internal/seencheck"
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
// Entries are scoped by SeenScope: the claim table's database as its
// dialect names it (see dialect.Identifier), the table and the consumer. A
// key recorded in one scope is not seen in another, so Middlewares of one
// consumer name on different tables, databases or servers — tenants, say —
// can share one Seen. The database's name includes the server's start, so
// that the scope changes whenever the database could have lost claims the
// pre-check remembers (see below), and a copy of the database started as a
// server of its own — a staging server cloned from production — never
// shares a scope with the original. That keeps apart what shares a store by
// mistake; it is no reason to share one on purpose: give each environment a
// store (or a seenredis.WithPrefix) of its own. Methods must be safe for
// concurrent use and should return quickly; they are called on the
// goroutine that called ProcessMessage.
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
// # Restarts and restores
//
// A restore of the claim database to an earlier point loses the claims of
// everything committed after that point, while the pre-check still knows
// them. Every way to put a database's files back — a base backup or a
// snapshot started as it is, a point-in-time recovery, a physical clone —
// ends with a server start, and the server's start is part of the scope:
// after it the pre-check finds nothing recorded before it. So the
// pre-check is cold after every restart of the database server, which
// costs only misses. A dump restored re-creates the claim table, which has
// a new name too.
//
// A Middleware reads the name on its first pre-check, again once the name
// it read is 5 seconds old by its clock (WithClock), and at once after one
// of its transactions lost its connection (see Middleware.SeenScope). A
// key is recorded in the scope read before its transaction began, never in
// one read after its claim committed. A Middleware that runs on through a
// restart or restore that it does not see as a lost connection answers
// from the old scope for at most 5 seconds after its last read: stop the
// consumers while restoring the claim database. What does not start the
// server — claims deleted by hand, or loaded back into the existing table
// (see each dialect's Identity) — keeps the scope: clear the pre-check's
// store then. docs/operations.md ("Pre-check and restores") has what each
// operation does to the scope.
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
	// Database names the claim table's database, and the start of the
	// server holding it, as its dialect reads them (dialect.Identifier):
	// for Postgres the cluster's system identifier, its timeline, the
	// server's start time (to the microsecond), the database, and the
	// table's OID and storage (relfilenode); for MySQL and MariaDB the
	// server's identifier, host, port and start (to the second), and the
	// table's database and creation time; for SQLite the database file's
	// path and a number drawn once per process. See each dialect's
	// Identity for the text.
	Database string
	// Table is the claim table, as configured (WithTable).
	Table string
	// Consumer is the consumer name.
	Consumer string
}

// String returns the scope as one text: Database, Table and Consumer, in
// that order, each preceded by its length in bytes (in decimal) and a
// colon — {Database: "pg", Table: "t", Consumer: "c"} is "2:pg1:t1:c".
// Two scopes have the same text only if they are equal, so a store can key
// its entries by it (seenredis keys by a hash of it). The format does not
// change between releases; what changes is Database, whenever the
// database's server starts.
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
// (one query) and a delivery reads again once it is 5 seconds old or a
// connection was lost; while it cannot be read the pre-check is left out,
// and it is read again at most every 10 seconds. Call SeenScope after
// EnsureSchema to learn at start whether the pre-check runs. New refuses WithSeen on a
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
// call — the pre-check's first use calls it too — and again once the name
// it read is 5 seconds old by the Middleware's clock (WithClock), or was
// dropped by ForgetSeenScope; in between it answers from memory. A read
// that fails leaves no scope: until one succeeds SeenScope returns an
// error wrapping ErrNoSeenScope, reading again at most every 10 seconds. A
// caller that finds a read under way waits for it. It works with or
// without WithSeen.
func (m *Middleware) SeenScope(ctx context.Context) (SeenScope, error) {
	s, err := m.seenScope.Get(ctx, m.readSeenScope)
	if errors.Is(err, seencheck.ErrForgotten) {
		err = fmt.Errorf("%w: consumer %q, table %s: %w", ErrNoSeenScope, m.consumer, m.table, err)
	}
	return s, err
}

// ForgetSeenScope drops the scope SeenScope read, so that the pre-check is
// left out until the scope has been read again from the database (the
// next delivery reads it). The Middleware calls it itself when one of its
// transactions loses its connection: the server may have restarted,
// failed over or been restored. A driver package built on the Middleware
// (idempgx) calls it for the connections it loses; an operator may call
// it after restoring the claim database under running consumers, though
// stopping them while restoring is safer (see Seen).
func (m *Middleware) ForgetSeenScope() { m.seenScope.Forget() }

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

// preCheckScope returns the scope the pre-check answers from for a call
// about to claim, read (or read again, see SeenScope) now, before the
// call's transaction begins: the call records its keys in it once their
// claims committed (recordSeen), so that a claim is never recorded in the
// scope of a server started after the claim committed — one restored
// without it. It is the zero SeenScope, which records nothing, without a
// pre-check or while the pre-check is left out.
func (m *Middleware) preCheckScope(ctx context.Context) SeenScope {
	if m.seen == nil {
		return SeenScope{}
	}
	scope, err := m.SeenScope(ctx)
	if err != nil {
		return SeenScope{}
	}
	return scope
}

// on reports whether s is a scope read from the database, not the zero
// SeenScope of a call without a pre-check.
func (s SeenScope) on() bool { return s.Database != "" }

// seenBefore reports whether the pre-check knows key in scope.
func (m *Middleware) seenBefore(ctx context.Context, scope SeenScope, key string) bool {
	return scope.on() && m.seen.Seen(ctx, scope, key)
}

// seenKeys reports which of keys the pre-check knows in scope: nil when
// there is no pre-check or it is left out.
func (m *Middleware) seenKeys(ctx context.Context, scope SeenScope, keys []string) []bool {
	if !scope.on() {
		return nil
	}
	return m.seenBatch.SeenKeys(ctx, scope, keys)
}

// recordSeenKeys tells the pre-check that keys' claims are committed, in
// the scope read before their transaction began.
func (m *Middleware) recordSeenKeys(ctx context.Context, scope SeenScope, keys []string) {
	if scope.on() && len(keys) > 0 {
		m.seenBatch.RecordKeys(ctx, scope, keys, m.ret.window)
	}
}

// recordSeen tells the pre-check that key's claim is committed, in the
// scope read before its transaction began.
func (m *Middleware) recordSeen(ctx context.Context, scope SeenScope, key string) {
	if scope.on() {
		m.seen.Record(ctx, scope, key, m.ret.window)
	}
}

// preCheckScopes holds a Middleware's pre-check scope (see SeenScope).
type preCheckScopes = seencheck.Scope[SeenScope]

// lostConnection forgets the pre-check's scope when an attempt failed
// because its connection was lost (see ForgetSeenScope).
func (r *runner) lostConnection(c dialect.Class) {
	if c.Kind == dialect.KindConnection && r.seenScope != nil {
		r.seenScope.Forget()
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
