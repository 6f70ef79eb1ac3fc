package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// namedPG is the Postgres dialect with Identity answering name (or err)
// without a query, so that a test's script needs no identity query.
type namedPG struct {
	*postgres.Dialect
	name  string
	err   error
	mu    sync.Mutex
	reads int
}

func (d *namedPG) Identity(context.Context, dialect.Table, dialect.QueryFunc) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	return d.name, d.err
}

// rename makes the database answer name from now on, as a restarted or
// restored server does.
func (d *namedPG) rename(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.name = name
}

// readCount returns how many times the name was read.
func (d *namedPG) readCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reads
}

// database is the name namedPG gives by default.
const database = "postgres system 1 timeline 1 start 1 table 2 storage 2 database 3 test"

// scope is the scope of newSeenMiddleware's Middleware.
var scope = idempotent.SeenScope{Database: database, Table: idempotent.DefaultTable, Consumer: consumer}

// newSeenMiddleware is newMiddleware with the dialect d (namedPG answering
// database when nil).
func newSeenMiddleware(t *testing.T, r *recorded, d dialect.Dialect, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	if d == nil {
		d = &namedPG{Dialect: pg, name: database}
	}
	mw, err := idempotent.New(r.db, d, consumer, append([]idempotent.Option{noWait}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// recordingSeen is a Seen that answers from a map and records every call.
type recordingSeen struct {
	mu       sync.Mutex
	known    map[string]bool // scope.String() + "/" + key
	recorded []string        // consumer/key
	scopes   []idempotent.SeenScope
	ttls     []time.Duration
	asked    int
}

func entry(s idempotent.SeenScope, key string) string { return s.String() + "/" + key }

func (s *recordingSeen) Seen(_ context.Context, scope idempotent.SeenScope, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked++
	return s.known[entry(scope, key)]
}

func (s *recordingSeen) Record(_ context.Context, scope idempotent.SeenScope, key string, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorded = append(s.recorded, scope.Consumer+"/"+key)
	s.scopes = append(s.scopes, scope)
	s.ttls = append(s.ttls, ttl)
}

// allSeen is a Seen that has seen everything, everywhere: any answer it
// gives is a Duplicate, so a delivery that reaches the claim shows that
// the pre-check was left out.
type allSeen struct {
	mu    sync.Mutex
	asked int
}

func (s *allSeen) Seen(context.Context, idempotent.SeenScope, string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked++
	return true
}

func (s *allSeen) Record(context.Context, idempotent.SeenScope, string, time.Duration) {}

func TestSeenHitSendsNothing(t *testing.T) {
	r := newRecorded(t)
	s := &recordingSeen{known: map[string]bool{entry(scope, key): true}}
	mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s))
	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error {
		t.Error("the handler ran for a known duplicate")
		return nil
	})
	if err != nil || got != idempotent.Duplicate {
		t.Fatalf("got (%v, %v), want duplicate", got, err)
	}
	r.wantCalls(t)
}

func TestSeenMissGoesToClaimAndRecordsAfterCommit(t *testing.T) {
	r := newRecorded(t)
	// Known in other scopes only: another consumer, table, database.
	other := func(f func(*idempotent.SeenScope)) string {
		s := scope
		f(&s)
		return entry(s, key)
	}
	s := &recordingSeen{known: map[string]bool{
		other(func(s *idempotent.SeenScope) { s.Consumer = "other" }):               true,
		other(func(s *idempotent.SeenScope) { s.Table = "app.processed_messages" }): true,
		other(func(s *idempotent.SeenScope) { s.Database += "2" }):                  true,
	}}
	mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s), idempotent.WithRetention(48*time.Hour))
	expectApplied(r.mock, key)
	got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	if len(s.recorded) != 1 || s.scopes[0] != scope || s.recorded[0] != consumer+"/"+key || s.ttls[0] != 48*time.Hour {
		t.Fatalf("recorded %v in %v with %v, want %s/%s in %v for the retention window", s.recorded, s.scopes, s.ttls, consumer, key, scope)
	}
}

func TestSeenNotRecordedWhenTheClaimRolledBack(t *testing.T) {
	r := newRecorded(t)
	s := &recordingSeen{}
	mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s))
	r.mock.ExpectBegin()
	expectClaim(r.mock, key, 1)
	r.mock.ExpectRollback()
	boom := errors.New("boom")
	if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if len(s.recorded) != 0 {
		t.Fatalf("recorded %v for a delivery that rolled back", s.recorded)
	}
}

func TestWithSeenNil(t *testing.T) {
	r := newRecorded(t)
	if _, err := idempotent.New(r.db, pg, consumer, idempotent.WithSeen(nil)); err == nil {
		t.Fatal("WithSeen(nil) accepted")
	}
}

func TestSeenLRU(t *testing.T) {
	ctx := context.Background()
	if _, err := idempotent.NewSeenLRU(0); err == nil {
		t.Fatal("capacity 0 accepted")
	}
	s, err := idempotent.NewSeenLRU(2)
	if err != nil {
		t.Fatal(err)
	}
	c := idempotent.SeenScope{Database: "db", Table: "t", Consumer: "c"}
	if s.Seen(ctx, c, "a") {
		t.Fatal("empty LRU saw a key")
	}
	s.Record(ctx, c, "a", time.Hour)
	s.Record(ctx, c, "b", time.Hour)
	if !s.Seen(ctx, c, "a") {
		t.Fatal("a recorded key was not seen")
	}
	// Scoped by consumer, table and database alike.
	for _, other := range []idempotent.SeenScope{
		{Database: "db", Table: "t", Consumer: "d"},
		{Database: "db", Table: "u", Consumer: "c"},
		{Database: "db2", Table: "t", Consumer: "c"},
	} {
		if s.Seen(ctx, other, "a") {
			t.Fatalf("a key recorded in %v was seen in %v", c, other)
		}
	}
	// "a" was used last: recording "c" evicts "b".
	s.Record(ctx, c, "c", time.Hour)
	if s.Len() != 2 || s.Seen(ctx, c, "b") || !s.Seen(ctx, c, "a") || !s.Seen(ctx, c, "c") {
		t.Fatalf("eviction: len %d", s.Len())
	}
	s.Record(ctx, c, "z", 0)
	if s.Seen(ctx, c, "z") {
		t.Fatal("a zero ttl recorded the key")
	}
	// Expiry, with a tiny ttl: expired entries are misses.
	s.Record(ctx, c, "short", time.Nanosecond)
	deadline := time.Now().Add(time.Second)
	for s.Seen(ctx, c, "short") {
		if time.Now().After(deadline) {
			t.Fatal("entry did not expire")
		}
	}
}

// TestSeenScopeString: distinct scopes have distinct texts, whatever bytes
// their fields hold.
func TestSeenScopeString(t *testing.T) {
	scopes := []idempotent.SeenScope{
		{},
		{Database: "a", Table: "b", Consumer: "c"},
		{Database: "a:b", Table: "", Consumer: "c"},
		{Database: "a", Table: "b:c", Consumer: ""},
		{Database: "1:a", Table: "b", Consumer: "c"},
		{Database: "", Table: "1:a1:b", Consumer: "c"},
	}
	seen := map[string]idempotent.SeenScope{}
	for _, s := range scopes {
		if o, ok := seen[s.String()]; ok {
			t.Fatalf("%#v and %#v share the text %q", o, s, s.String())
		}
		seen[s.String()] = s
	}
	if got := (idempotent.SeenScope{Database: "pg", Table: "t", Consumer: "c"}).String(); got != "2:pg1:t1:c" {
		t.Fatalf("String() = %q", got)
	}
}

// TestSeenScopeReadOnceFromTheDatabase: the first delivery reads the
// database's name with the dialect's identity query, before the pre-check
// is consulted; later deliveries within 5 seconds do not read it again.
func TestSeenScopeReadOnceFromTheDatabase(t *testing.T) {
	r := newRecorded(t)
	ctx := context.Background()
	// The query the Postgres dialect sends, as it sends it.
	var identitySQL string
	var identityArgs []any
	if _, err := pg.Identity(ctx, dialect.Table{Name: idempotent.DefaultTable}, func(_ context.Context, q string, args ...any) (string, error) {
		identitySQL, identityArgs = q, args
		return database, nil
	}); err != nil || len(identityArgs) != 1 {
		t.Fatalf("Identity: %v, args %v", err, identityArgs)
	}
	s := &recordingSeen{known: map[string]bool{entry(scope, key): true}}
	mw := newSeenMiddleware(t, r, pg, idempotent.WithSeen(s))
	r.mock.ExpectQuery(identitySQL).WithArgs(identityArgs[0]).WillReturnRows(sqlmock.NewRows([]string{"identity"}).AddRow(database))
	for i := 0; i < 3; i++ {
		if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
			t.Fatalf("delivery %d: got (%v, %v), want duplicate", i, got, err)
		}
	}
	r.wantCalls(t, identitySQL)
	if got, err := mw.SeenScope(ctx); err != nil || got != scope {
		t.Fatalf("SeenScope = %v, %v; want %v", got, err, scope)
	}
}

// TestWithSeenRefusedWithoutIdentifier: a dialect that cannot name its
// database gets no pre-check: New refuses WithSeen, naming the dialect, and
// SeenScope says why.
func TestWithSeenRefusedWithoutIdentifier(t *testing.T) {
	r := newRecorded(t)
	lru, err := idempotent.NewSeenLRU(10)
	if err != nil {
		t.Fatal(err)
	}
	d := struct{ dialect.Dialect }{pg}
	if _, err := idempotent.New(r.db, d, consumer, idempotent.WithSeen(lru)); err == nil || !strings.Contains(err.Error(), "postgres dialect cannot name its database") {
		t.Fatalf("New with WithSeen on a dialect without Identifier: %v, want an error naming the dialect", err)
	}
	mw, err := idempotent.New(r.db, d, consumer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mw.SeenScope(context.Background()); !errors.Is(err, idempotent.ErrNoSeenScope) {
		t.Fatalf("SeenScope: %v, want ErrNoSeenScope", err)
	}
	r.wantCalls(t)
}

// TestSeenScopeUnreadableLeavesThePreCheckOut: when the database cannot be
// named — the dialect's query fails, or names nothing — the pre-check is
// never consulted nor recorded: with a pre-check that has seen everything,
// every delivery still goes to the claim. A failed read is tried again
// only after a while, not on every delivery.
func TestSeenScopeUnreadableLeavesThePreCheckOut(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("permission denied for function pg_control_system")
	for name, d := range map[string]func() dialect.Dialect{
		"the query fails":     func() dialect.Dialect { return &namedPG{Dialect: pg, err: boom} },
		"the name is nothing": func() dialect.Dialect { return &namedPG{Dialect: pg} },
	} {
		t.Run(name, func(t *testing.T) {
			r := newRecorded(t)
			d := d()
			s := &allSeen{}
			mw := newSeenMiddleware(t, r, d, idempotent.WithSeen(s))
			for i := 0; i < 3; i++ {
				expectApplied(r.mock, fmt.Sprint(key, i))
				if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprint(key, i)}, effect); err != nil || got != idempotent.Applied {
					t.Fatalf("delivery %d: got (%v, %v), want applied by the claim", i, got, err)
				}
			}
			if s.asked != 0 {
				t.Fatalf("the pre-check was asked %d times", s.asked)
			}
			if _, err := mw.SeenScope(ctx); !errors.Is(err, idempotent.ErrNoSeenScope) {
				t.Fatalf("SeenScope: %v, want ErrNoSeenScope", err)
			}
			if n, ok := d.(*namedPG); ok && n.reads != 1 {
				t.Fatalf("the identity was read %d times in a row, want once until the retry interval", n.reads)
			}
			if n, ok := d.(*namedPG); ok && n.err != nil {
				if _, err := mw.SeenScope(ctx); !errors.Is(err, n.err) {
					t.Fatalf("SeenScope: %v, want the query's error", err)
				}
			}
		})
	}
}

// TestSeenScopeTablesApart: two Middlewares of one consumer on two tables
// of one database, sharing one pre-check, do not answer for each other.
func TestSeenScopeTablesApart(t *testing.T) {
	ctx := context.Background()
	lru, err := idempotent.NewSeenLRU(10)
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorded(t)
	a := newSeenMiddleware(t, r, nil, idempotent.WithSeen(lru))
	b := newSeenMiddleware(t, r, nil, idempotent.WithSeen(lru), idempotent.WithTable("app.processed_messages"))
	expectApplied(r.mock, key)
	if got, err := a.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("first table: got (%v, %v), want applied", got, err)
	}
	r.mock.ExpectBegin()
	r.mock.ExpectExec(pg.ClaimSQL(dialect.Table{Schema: "app", Name: "processed_messages"})).WithArgs(consumer, key).WillReturnResult(sqlmock.NewResult(0, 1))
	expectEffect(r.mock)
	r.mock.ExpectCommit()
	if got, err := b.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("second table: got (%v, %v), want applied", got, err)
	}
	if got, err := a.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
		t.Fatalf("first table again: got (%v, %v), want duplicate from the pre-check", got, err)
	}
}

// batchSeen is a recordingSeen that answers and records batches itself
// (SeenBatch), or answers a batch with a slice of the wrong length.
type batchSeen struct {
	recordingSeen
	batchAsks, batchRecords int
	wrongLength             bool
}

func (s *batchSeen) SeenKeys(ctx context.Context, scope idempotent.SeenScope, keys []string) []bool {
	s.mu.Lock()
	s.batchAsks++
	s.mu.Unlock()
	if s.wrongLength {
		return []bool{true}
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = s.recordingSeen.Seen(ctx, scope, k)
	}
	return out
}

func (s *batchSeen) RecordKeys(ctx context.Context, scope idempotent.SeenScope, keys []string, ttl time.Duration) {
	s.mu.Lock()
	s.batchRecords++
	s.mu.Unlock()
	for _, k := range keys {
		s.recordingSeen.Record(ctx, scope, k, ttl)
	}
}

// TestSeenBatch: a batch claims only the keys the pre-check does not know,
// opens no transaction when it knows them all, and records the claimed keys
// only after the commit — key by key, or in one call where the pre-check is
// a SeenBatch.
func TestSeenBatch(t *testing.T) {
	ctx := context.Background()
	keys := []string{"c", "a", "b", "a"}
	for _, batch := range []bool{false, true} {
		name := "Seen"
		if batch {
			name = "SeenBatch"
		}
		t.Run(name+": known keys are not claimed", func(t *testing.T) {
			r := newRecorded(t)
			bs := &batchSeen{recordingSeen: recordingSeen{known: map[string]bool{entry(scope, "a"): true}}}
			var s idempotent.Seen = &bs.recordingSeen
			if batch {
				s = bs
			}
			mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s))
			r.mock.ExpectBegin()
			r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"b", "c"})).
				WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("c"))
			expectEffect(r.mock)
			r.mock.ExpectCommit()
			var fresh []int
			outs, err := mw.ProcessMessages(ctx, keyMessages(keys...), func(ctx context.Context, tx *sql.Tx, f []int) error {
				fresh = f
				return effect(ctx, tx)
			})
			want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}
			if err != nil || !slices.Equal(outs, want) || !slices.Equal(fresh, []int{0}) {
				t.Fatalf("got (%v, %v), fresh %v; want %v, fresh [0]", outs, err, fresh, want)
			}
			r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT")
			if !slices.Equal(bs.recorded, []string{consumer + "/b", consumer + "/c"}) {
				t.Fatalf("recorded %v, want the claimed keys b and c", bs.recorded)
			}
			if batch && (bs.batchAsks != 1 || bs.batchRecords != 1) {
				t.Fatalf("%d SeenKeys and %d RecordKeys calls, want one each", bs.batchAsks, bs.batchRecords)
			}
		})
	}
	t.Run("all known: no transaction", func(t *testing.T) {
		r := newRecorded(t)
		s := &recordingSeen{known: map[string]bool{entry(scope, "a"): true, entry(scope, "b"): true, entry(scope, "c"): true}}
		mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s))
		outs, err := mw.ProcessMessages(ctx, keyMessages(keys...), func(context.Context, *sql.Tx, []int) error {
			t.Error("the handler ran for known duplicates")
			return nil
		})
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}) {
			t.Fatalf("got (%v, %v), want four duplicates", outs, err)
		}
		r.wantCalls(t)
	})
	t.Run("rolled back: nothing recorded", func(t *testing.T) {
		r := newRecorded(t)
		s := &recordingSeen{}
		mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(s))
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, sqlmock.AnyArg()).
			WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("a").AddRow("b").AddRow("c"))
		r.mock.ExpectRollback()
		boom := errors.New("boom")
		if _, err := mw.ProcessMessages(ctx, keyMessages(keys...), func(context.Context, *sql.Tx, []int) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("err = %v, want boom", err)
		}
		if len(s.recorded) != 0 {
			t.Fatalf("recorded %v for a batch that rolled back", s.recorded)
		}
	})
	t.Run("a SeenBatch answer of the wrong length is a miss", func(t *testing.T) {
		r := newRecorded(t)
		bs := &batchSeen{wrongLength: true}
		mw := newSeenMiddleware(t, r, nil, idempotent.WithSeen(bs))
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b", "c"})).
			WillReturnRows(sqlmock.NewRows([]string{"message_key"}))
		r.mock.ExpectRollback()
		outs, err := mw.ProcessMessages(ctx, keyMessages(keys...), func(context.Context, *sql.Tx, []int) error { return nil })
		if err != nil || slices.Contains(outs, idempotent.Applied) {
			t.Fatalf("got (%v, %v), want four duplicates found by the claim", outs, err)
		}
		r.wantCalls(t, "BEGIN", batchSQL, "ROLLBACK")
	})
}

// TestSeenBatchOf: a batch is asked and recorded in one call where the
// pre-check is a SeenBatch, key by key otherwise; an answer of the wrong
// length is a miss for every key.
func TestSeenBatchOf(t *testing.T) {
	ctx := context.Background()
	scope := idempotent.SeenScope{Database: "db", Table: "claims", Consumer: consumer}
	keys := []string{"a", "b", "c"}
	known := map[string]bool{entry(scope, "b"): true}
	if idempotent.SeenBatchOf(nil) != nil {
		t.Fatal("SeenBatchOf(nil) is not nil")
	}
	one := &recordingSeen{known: known}
	b := idempotent.SeenBatchOf(one)
	if got := b.SeenKeys(ctx, scope, keys); !slices.Equal(got, []bool{false, true, false}) || one.asked != 3 {
		t.Fatalf("key by key: %v in %d asks", got, one.asked)
	}
	b.RecordKeys(ctx, scope, keys, time.Hour)
	b.RecordKeys(ctx, scope, nil, time.Hour)
	if want := []string{consumer + "/a", consumer + "/b", consumer + "/c"}; !slices.Equal(one.recorded, want) {
		t.Fatalf("recorded %v, want %v", one.recorded, want)
	}
	many := &batchSeen{recordingSeen: recordingSeen{known: known}}
	b = idempotent.SeenBatchOf(many)
	if got := b.SeenKeys(ctx, scope, keys); !slices.Equal(got, []bool{false, true, false}) || many.batchAsks != 1 {
		t.Fatalf("a batch: %v in %d batch asks, want one", got, many.batchAsks)
	}
	b.RecordKeys(ctx, scope, keys, time.Hour)
	if many.batchRecords != 1 || len(many.recorded) != 3 {
		t.Fatalf("a batch recorded in %d calls: %v", many.batchRecords, many.recorded)
	}
	many.wrongLength = true
	if got := b.SeenKeys(ctx, scope, keys); slices.Contains(got, true) || len(got) != 3 {
		t.Fatalf("an answer of the wrong length: %v, want three misses", got)
	}
	if !b.Seen(ctx, scope, "b") || b.Seen(ctx, scope, "a") {
		t.Fatal("Seen does not ask the pre-check")
	}
}

// restarted is the name namedPG gives after the server restarted (or was
// restored): the start time in it changed.
const restarted = "postgres system 1 timeline 1 start 2 table 2 storage 2 database 3 test"

// movableClock is a Middleware clock that a test moves.
type movableClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *movableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *movableClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// restartedUnderAMiddleware returns a Middleware with a pre-check that
// knows key in scope, whose first delivery of key was a Duplicate from the
// pre-check, after which its database was renamed restarted (as a
// restarted or restored server is).
func restartedUnderAMiddleware(t *testing.T) (*recorded, *namedPG, *movableClock, *recordingSeen, *idempotent.Middleware) {
	t.Helper()
	r := newRecorded(t)
	d := &namedPG{Dialect: pg, name: database}
	clock := &movableClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	s := &recordingSeen{known: map[string]bool{entry(scope, key): true}}
	mw := newSeenMiddleware(t, r, d, idempotent.WithSeen(s), idempotent.WithClock(clock.Now))
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate {
		t.Fatalf("before the restart: got (%v, %v), want duplicate", got, err)
	}
	d.rename(restarted)
	return r, d, clock, s, mw
}

// TestSeenScopeReadAgainWhenAged: a Middleware that runs on through a
// restart of its database answers from the scope it read for at most 5
// seconds of its clock (WithClock): then it reads the name again, and a
// key recorded before the restart is no longer a Duplicate: it goes to the
// claim.
func TestSeenScopeReadAgainWhenAged(t *testing.T) {
	ctx := context.Background()
	r, d, clock, s, mw := restartedUnderAMiddleware(t)
	clock.add(5*time.Second - time.Nanosecond)
	if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Duplicate || d.readCount() != 1 {
		t.Fatalf("within 5s of the read: got (%v, %v) after %d reads, want duplicate from the scope read once", got, err, d.readCount())
	}
	clock.add(time.Nanosecond)
	expectApplied(r.mock, key)
	if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("5s after the read: got (%v, %v), want applied by the claim (the scope read again)", got, err)
	}
	if d.readCount() != 2 {
		t.Fatalf("the name was read %d times, want twice", d.readCount())
	}
	if want := (idempotent.SeenScope{Database: restarted, Table: scope.Table, Consumer: scope.Consumer}); len(s.scopes) != 1 || s.scopes[0] != want {
		t.Fatalf("recorded in %v, want the new scope %v", s.scopes, want)
	}
	r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
}

// TestSeenScopeForgottenAtALostConnection: an attempt that loses its
// connection (the server shut down: 57P01) makes the Middleware forget the
// scope at once, whatever its age: the next delivery reads it again.
func TestSeenScopeForgottenAtALostConnection(t *testing.T) {
	for name, lose := range map[string]func(m sqlmock.Sqlmock){
		"at the claim": func(m sqlmock.Sqlmock) {
			m.ExpectBegin()
			expectClaimError(m, "other", &pq.Error{Code: "57P01", Message: "terminating connection due to administrator command"})
			m.ExpectRollback()
		},
		"at BEGIN": func(m sqlmock.Sqlmock) {
			m.ExpectBegin().WillReturnError(&pq.Error{Code: "57P03"}) // cannot_connect_now
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			r, d, _, _, mw := restartedUnderAMiddleware(t)
			lose(r.mock)
			expectApplied(r.mock, "other")
			if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "other"}, effect); err != nil || got != idempotent.Applied {
				t.Fatalf("a delivery whose first attempt lost its connection: got (%v, %v), want applied", got, err)
			}
			expectApplied(r.mock, key)
			if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
				t.Fatalf("after the lost connection: got (%v, %v), want applied by the claim (the scope read again)", got, err)
			}
			if d.readCount() != 2 {
				t.Fatalf("the name was read %d times, want twice", d.readCount())
			}
		})
	}
}

// TestSeenRecordedInTheScopeReadBeforeTheTransaction: a claim is recorded
// in the scope read before its transaction began, even when the scope was
// read again (by another delivery) while the transaction ran: a name read
// after the claim committed may be the one of a server restored without
// that claim.
func TestSeenRecordedInTheScopeReadBeforeTheTransaction(t *testing.T) {
	r := newRecorded(t)
	ctx := context.Background()
	d := &namedPG{Dialect: pg, name: database}
	clock := &movableClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	s := &recordingSeen{}
	mw := newSeenMiddleware(t, r, d, idempotent.WithSeen(s), idempotent.WithClock(clock.Now))
	expectApplied(r.mock, key)
	got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		d.rename(restarted)
		clock.add(time.Minute)
		if sc, err := mw.SeenScope(context.Background()); err != nil || sc.Database != restarted {
			t.Errorf("another delivery's read: %v, %v", sc, err)
		}
		return effect(ctx, tx)
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	if len(s.scopes) != 1 || s.scopes[0] != scope {
		t.Fatalf("recorded in %v, want the scope read before the transaction, %v", s.scopes, scope)
	}
}

// TestForgetSeenScope: ForgetSeenScope drops the scope; the next
// delivery reads it again.
func TestForgetSeenScope(t *testing.T) {
	r := newRecorded(t)
	ctx := context.Background()
	d := &namedPG{Dialect: pg, name: database}
	mw := newSeenMiddleware(t, r, d, idempotent.WithSeen(&recordingSeen{}))
	if sc, err := mw.SeenScope(ctx); err != nil || sc != scope {
		t.Fatalf("SeenScope = %v, %v", sc, err)
	}
	d.rename(restarted)
	mw.ForgetSeenScope()
	if sc, err := mw.SeenScope(ctx); err != nil || sc.Database != restarted || d.readCount() != 2 {
		t.Fatalf("after ForgetSeenScope: %v, %v after %d reads; want %q read again", sc, err, d.readCount(), restarted)
	}
}
