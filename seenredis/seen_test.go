package seenredis_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/seenredis"
)

// redisServer is a redis-server of the test's own, on a free loopback port,
// never the shared one.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server not found: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &redisServer{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.kill)
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer", s.addr)
		}
		select {
		case <-s.done:
			t.Fatalf("redis-server on %s exited", s.addr)
		case <-time.After(10 * time.Millisecond): // polling interval
		}
	}
	return s
}

func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

func newSeen(t *testing.T, addr string, opts ...seenredis.Option) (*seenredis.Seen, *redis.Client) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	s, err := seenredis.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// orders and billing are two scopes of one database and table.
var (
	orders  = idempotent.SeenScope{Database: "db", Table: "claims", Consumer: "orders"}
	billing = idempotent.SeenScope{Database: "db", Table: "claims", Consumer: "billing"}
)

func TestSeenRecordScopeAndExpiry(t *testing.T) {
	r := startRedis(t)
	s, c := newSeen(t, r.addr)
	ctx := context.Background()
	if s.Seen(ctx, orders, "k") {
		t.Fatal("an unrecorded key was seen")
	}
	s.Record(ctx, orders, "k", time.Hour)
	if !s.Seen(ctx, orders, "k") {
		t.Fatal("a recorded key was not seen")
	}
	// Scoped by consumer, table and database, and no two pairs share a
	// Redis key.
	for _, other := range []idempotent.SeenScope{
		billing,
		{Database: orders.Database, Table: "claims2", Consumer: orders.Consumer},
		{Database: "db2", Table: orders.Table, Consumer: orders.Consumer},
	} {
		if s.Seen(ctx, other, "k") {
			t.Fatalf("a key recorded in %v was seen in %v", orders, other)
		}
	}
	if s.Key(orders, "k") == s.Key(billing, "k") || len(s.Prefix(orders)) != len(seenredis.DefaultPrefix)+33 || !strings.HasPrefix(s.Key(orders, "k"), seenredis.DefaultPrefix) {
		t.Fatalf("keys %q and %q", s.Key(orders, "k"), s.Key(billing, "k"))
	}
	// A prefix of the user's own is followed by the scope too.
	p, _ := newSeen(t, r.addr, seenredis.WithPrefix("app:"))
	if !strings.HasPrefix(p.Key(orders, "k"), "app:") || p.Key(orders, "k") == p.Key(billing, "k") || p.Seen(ctx, orders, "k") {
		t.Fatalf("with a prefix: keys %q and %q", p.Key(orders, "k"), p.Key(billing, "k"))
	}
	// The key expires no later than the ttl.
	pttl, err := c.PTTL(ctx, s.Key(orders, "k")).Result()
	if err != nil || pttl <= 0 || pttl > time.Hour {
		t.Fatalf("PTTL %v, %v; want (0, 1h]", pttl, err)
	}
	s.Record(ctx, orders, "sub-ms", 500*time.Microsecond)
	if s.Seen(ctx, orders, "sub-ms") {
		t.Fatal("a ttl under a millisecond was recorded (it would be rounded up)")
	}
	if _, err := seenredis.New(nil); err == nil {
		t.Fatal("New(nil) accepted")
	}
	if _, err := seenredis.New(c, seenredis.WithTimeout(0)); err == nil {
		t.Fatal("WithTimeout(0) accepted")
	}
}

func TestRedisDownIsAMiss(t *testing.T) {
	r := startRedis(t)
	var failures atomic.Int32
	s, _ := newSeen(t, r.addr, seenredis.WithErrorHandler(func(error) { failures.Add(1) }))
	ctx := context.Background()
	s.Record(ctx, orders, "k", time.Hour)
	r.kill()
	if s.Seen(ctx, orders, "k") {
		t.Fatal("Seen answered true with Redis down")
	}
	s.Record(ctx, orders, "k2", time.Hour) // must not panic or block
	if failures.Load() < 2 {
		t.Fatalf("%d failures reported, want 2", failures.Load())
	}
}

// TestKillRedisMidRun delivers every message three times from several
// workers through the database/sql Middleware with the Redis pre-check,
// and kills Redis half way: every effect is applied exactly once.
func TestKillRedisMidRun(t *testing.T) {
	r := startRedis(t)
	s, _ := newSeen(t, r.addr)
	hits := &countingSeen{s: s}
	db, schema, m := effectsSetup(t, hits)
	const messages, copies, workers = 200, 3, 6
	deliveries := make(chan string)
	var delivered atomic.Int32
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range deliveries {
				_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: k}, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".effects (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1", k)
					return err
				})
				if err != nil {
					t.Error(err)
				}
				if delivered.Add(1) == messages*copies/2 {
					r.kill()
					close(killed)
				}
			}
		}()
	}
	// Copies of each message arrive in separate passes, so that the later
	// ones find the earlier ones' records.
	for c := 0; c < copies; c++ {
		for i := 0; i < messages; i++ {
			deliveries <- "m" + strconv.Itoa(i)
		}
	}
	close(deliveries)
	wg.Wait()
	<-killed
	auditEffects(t, db, schema, messages)
	if hits.hits.Load() == 0 {
		t.Fatal("the pre-check answered no duplicate before Redis was killed")
	}
	t.Logf("pre-check hits: %d of %d duplicates", hits.hits.Load(), messages*(copies-1))
}

// effectsSetup makes a schema of the test's own with an effects table
// (id, n: how many times the effect of id was applied) and a Middleware
// for consumer "orders" with the pre-check seen.
func effectsSetup(t *testing.T, seen idempotent.Seen) (*sql.DB, string, *idempotent.Middleware) {
	t.Helper()
	db := openDB(t)
	schema := testenv.UniqueName("t")
	mustExec(t, db, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, db, "DROP SCHEMA "+schema+" CASCADE") })
	mustExec(t, db, "CREATE TABLE "+schema+".effects (id text PRIMARY KEY, n int NOT NULL)")
	m, err := idempotent.New(db, postgres.New(), "orders", idempotent.WithTable(schema+".claims"), idempotent.WithSeen(seen))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, schema, m
}

// auditEffects checks that each of messages effects was applied exactly
// once.
func auditEffects(t *testing.T, db *sql.DB, schema string, messages int) {
	t.Helper()
	var rows, total, doubled int
	if err := db.QueryRow("SELECT count(*), coalesce(sum(n), 0), count(*) FILTER (WHERE n <> 1) FROM "+schema+".effects").Scan(&rows, &total, &doubled); err != nil {
		t.Fatal(err)
	}
	if rows != messages || total != messages || doubled != 0 {
		t.Fatalf("%d messages applied, %d effects, %d doubled; want %d, %d, 0", rows, total, doubled, messages, messages)
	}
}

type countingSeen struct {
	s    *seenredis.Seen
	hits atomic.Int32
}

func (c *countingSeen) Record(ctx context.Context, scope idempotent.SeenScope, key string, ttl time.Duration) {
	c.s.Record(ctx, scope, key, ttl)
}

func (c *countingSeen) Seen(ctx context.Context, scope idempotent.SeenScope, key string) bool {
	ok := c.s.Seen(ctx, scope, key)
	if ok {
		c.hits.Add(1)
	}
	return ok
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	return testenv.OpenPostgres(t, 8)
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func TestSeenKeysAndRecordKeys(t *testing.T) {
	r := startRedis(t)
	var failures atomic.Int32
	s, c := newSeen(t, r.addr, seenredis.WithErrorHandler(func(error) { failures.Add(1) }))
	ctx := context.Background()
	s.RecordKeys(ctx, orders, []string{"a", "c"}, time.Hour)
	s.Record(ctx, billing, "b", time.Hour)
	got := s.SeenKeys(ctx, orders, []string{"a", "b", "c", "d"})
	if want := []bool{true, false, true, false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("SeenKeys = %v, want %v (scoped)", got, want)
	}
	if !s.Seen(ctx, orders, "c") {
		t.Fatal("a key recorded by RecordKeys is not seen by Seen")
	}
	pttl, err := c.PTTL(ctx, s.Key(orders, "a")).Result()
	if err != nil || pttl <= 0 || pttl > time.Hour {
		t.Fatalf("PTTL %v, %v; want (0, 1h]", pttl, err)
	}
	s.RecordKeys(ctx, orders, []string{"sub-ms"}, 500*time.Microsecond)
	if s.Seen(ctx, orders, "sub-ms") {
		t.Fatal("a ttl under a millisecond was recorded")
	}
	if len(s.SeenKeys(ctx, orders, nil)) != 0 {
		t.Fatal("SeenKeys of no keys answered something")
	}
	r.kill()
	if got := s.SeenKeys(ctx, orders, []string{"a", "c"}); got[0] || got[1] {
		t.Fatalf("SeenKeys answered %v with Redis down, want all false", got)
	}
	s.RecordKeys(ctx, orders, []string{"e"}, time.Hour) // must not panic or block
	if failures.Load() < 2 {
		t.Fatalf("%d failures reported, want 2", failures.Load())
	}
}

// TestKillRedisMidRunBatches is TestKillRedisMidRun for ProcessMessages: every
// message arrives three times in batches of 10 from several workers, and
// Redis is killed half way. Every effect is applied exactly once.
func TestKillRedisMidRunBatches(t *testing.T) {
	r := startRedis(t)
	s, _ := newSeen(t, r.addr)
	hits := &countingSeenBatch{countingSeen: countingSeen{s: s}}
	db, schema, m := effectsSetup(t, hits)
	const messages, copies, workers, size = 400, 3, 4, 10
	batches := make(chan []string)
	var delivered atomic.Int32
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for keys := range batches {
				_, err := m.ProcessMessages(context.Background(), keyMessages(keys...), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
					ids := make([]string, len(fresh))
					for j, i := range fresh {
						ids[j] = keys[i]
					}
					_, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".effects (id, n) SELECT id, 1 FROM unnest($1::text[]) AS u(id) ORDER BY id ON CONFLICT (id) DO UPDATE SET n = effects.n + 1", "{"+strings.Join(ids, ",")+"}")
					return err
				})
				if err != nil {
					t.Error(err)
				}
				if delivered.Add(size) == messages*copies/2 {
					r.kill()
					close(killed)
				}
			}
		}()
	}
	for c := 0; c < copies; c++ {
		for i := 0; i < messages; i += size {
			keys := make([]string, size)
			for j := range keys {
				keys[j] = "m" + strconv.Itoa(i+j)
			}
			batches <- keys
		}
	}
	close(batches)
	wg.Wait()
	<-killed
	auditEffects(t, db, schema, messages)
	if hits.hits.Load() == 0 || hits.batchCalls.Load() == 0 {
		t.Fatalf("the pre-check answered %d duplicates in %d batch calls before Redis was killed, want some", hits.hits.Load(), hits.batchCalls.Load())
	}
	t.Logf("pre-check hits: %d of %d duplicates", hits.hits.Load(), messages*(copies-1))
}

// countingSeenBatch counts the keys its SeenKeys answers true.
type countingSeenBatch struct {
	countingSeen
	batchCalls atomic.Int32
}

func (c *countingSeenBatch) SeenKeys(ctx context.Context, scope idempotent.SeenScope, keys []string) []bool {
	c.batchCalls.Add(1)
	hit := c.s.SeenKeys(ctx, scope, keys)
	for _, h := range hit {
		if h {
			c.hits.Add(1)
		}
	}
	return hit
}

func (c *countingSeenBatch) RecordKeys(ctx context.Context, scope idempotent.SeenScope, keys []string, ttl time.Duration) {
	c.s.RecordKeys(ctx, scope, keys, ttl)
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
