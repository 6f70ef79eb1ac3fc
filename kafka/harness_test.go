package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// The integration tests of the package run it against an in-process Kafka
// cluster (franz-go's kfake, which speaks the real protocol, group
// coordination included) and a real Postgres.
//
// The database comes from IDEMPOTENT_POSTGRES_DSN, or the local server at
// postgres://postgres@127.0.0.1:5432/test. If it does not answer the tests
// skip — except when CI is set, where they fail.

// openDB opens the test database (testenv.OpenPostgres); extra are
// connection parameters such as "synchronous_commit=off", on every
// connection of the pool.
func openDB(t testing.TB, maxConns int, extra ...string) *sql.DB {
	t.Helper()
	db := testenv.OpenPostgres(t, maxConns) // skips, or fails under CI, when Postgres does not answer
	if len(extra) == 0 {
		return db
	}
	d := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	for _, e := range extra {
		if strings.Contains(d, "?") {
			d += "&" + e
		} else {
			d += "?" + e
		}
	}
	withExtra, err := sql.Open("postgres", d)
	if err != nil {
		t.Fatal(err)
	}
	withExtra.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { withExtra.Close() })
	return withExtra
}

// schema creates a schema of the test's own, with the claim, offsets and
// outbox tables in it, dropped at the end.
func schema(t testing.TB, db *sql.DB) string {
	t.Helper()
	s := testenv.UniqueName("kt")
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), `DROP SCHEMA `+s+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", s, err)
		}
	})
	if err := kafka.EnsureSchema(ctx, db, s+".kafka_offsets"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`
CREATE TABLE %[1]s.accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.ledger (id text NOT NULL, account text NOT NULL, amount bigint NOT NULL, member text NOT NULL);`, s)); err != nil {
		t.Fatal(err)
	}
	return s
}

// newMiddleware returns a Middleware on the claim table of schema s, with
// opts after the table, and ensures the table.
func newMiddleware(t testing.TB, db *sql.DB, s, consumer string, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	mw, err := idempotent.New(db, postgres.New(), consumer, append([]idempotent.Option{idempotent.WithTable(s + ".processed_messages")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return mw
}

func newOutbox(t testing.TB, db *sql.DB, s, consumer string) *outbox.Outbox {
	t.Helper()
	return testenv.Outbox(t, db, s, consumer)
}

// newCluster starts a kfake cluster with topics of the given partitions,
// closed at the end of the test. Group sessions may be short, so that a
// member that stops answering is fenced out quickly.
func newCluster(t testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topics...),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func producer(t testing.TB, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// member runs one consumer group member until stopped.
type member struct {
	name   string
	cancel context.CancelFunc
	done   chan error
}

func startMember(c *kafka.Consumer, name string, opts ...kgo.Opt) *member {
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(ctx, opts...) }()
	return m
}

func (m *member) stop(t testing.TB) {
	t.Helper()
	m.cancel()
	select {
	case err := <-m.done:
		if err != nil {
			t.Errorf("member %s: Run: %v", m.name, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("member %s: Run did not return within a minute of its context ending", m.name)
	}
}

// waitFor polls cond until it holds, failing after a minute.
func waitFor(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// storedOffsets reads the offsets table.
func storedOffsets(t testing.TB, db *sql.DB, s, consumer, topic string) map[int32]int64 {
	t.Helper()
	rows, err := db.Query(`SELECT partition, next_offset FROM `+s+`.kafka_offsets WHERE consumer = $1 AND topic = $2`, consumer, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			t.Fatal(err)
		}
		out[p] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// counter is an adapter.Observer that counts events by type.
type counter struct {
	mu sync.Mutex
	n  map[adapter.EventType]int
}

func (c *counter) Observe(_ context.Context, e adapter.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[adapter.EventType]int{}
	}
	c.n[e.Type]++
}

func (c *counter) get(t adapter.EventType) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[t]
}

// where is the place of an event of the kafka Consumer, from its Source
// ("topic/partition/offset"); offset is -1 when the Source names none.
type where struct {
	topic     string
	partition int32
	offset    int64
}

func whereOf(t testing.TB, e adapter.Event) where {
	t.Helper()
	parts := strings.Split(e.Source, "/")
	if len(parts) < 2 || len(parts) > 3 {
		t.Fatalf("%v event with Source %q, want topic/partition[/offset]", e.Type, e.Source)
	}
	p, err := strconv.ParseInt(parts[1], 10, 32)
	if err != nil {
		t.Fatalf("%v event with Source %q: %v", e.Type, e.Source, err)
	}
	at := where{topic: parts[0], partition: int32(p), offset: -1}
	if len(parts) == 3 {
		if at.offset, err = strconv.ParseInt(parts[2], 10, 64); err != nil {
			t.Fatalf("%v event with Source %q: %v", e.Type, e.Source, err)
		}
	}
	return at
}

// recordOf returns the record of a record event: its Detail, or a
// kafka.Dropped's record; nil for any other event.
func recordOf(e adapter.Event) *kgo.Record {
	switch d := e.Detail.(type) {
	case *kgo.Record:
		return d
	case kafka.Dropped:
		return d.Record
	}
	return nil
}
