package redisstream_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/redisstream"
)

// redisServer is a redis-server of the test's own on a loopback port,
// never the shared one, with an append-only file synced on every write, so
// that a SIGKILL loses nothing it acknowledged.
type redisServer struct {
	bin, dir string
	port     int
	addr     string
	cmd      *exec.Cmd
	done     chan struct{}
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found")
		}
		t.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &redisServer{bin: bin, dir: t.TempDir(), port: port, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.start(t)
	t.Cleanup(s.kill)
	return s
}

// start starts the server and waits until it answers.
func (s *redisServer) start(t *testing.T) {
	t.Helper()
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer", s.addr)
		}
		select {
		case <-done:
			t.Fatalf("redis-server on %s exited", s.addr)
		case <-time.After(10 * time.Millisecond): // polling interval
		}
	}
}

// kill stops the server with SIGKILL and waits for it to exit.
func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// TestRedisKilledAfterCommit: Redis dies while a handler commits, so the
// XACK fails; Run reports the failed reads and goes on; once Redis is
// back, the entry — still pending, the group restored from its
// append-only file — is re-claimed and settled as a Duplicate, and a new
// entry is applied: one effect each.
func TestRedisKilledAfterCommit(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	stream := newStream(t, rdb, group)
	orders := testenv.MakeOrders(2)
	first := publish(t, rdb, stream, orders[0], time.Now().Add(-time.Minute))

	var killed atomic.Bool
	var ev events
	h := redisstream.Decode(redisstream.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, d *redisstream.Delivery) error {
		if killed.CompareAndSwap(false, true) {
			srv.kill() // the commit that follows reaches Postgres; the XACK finds no Redis
		}
		return testenv.Credit(ctx, tx, l.schema, o)
	})
	c, err := redisstream.NewConsumer(l.mw, h, redisstream.WithObserver(&ev), redisstream.WithBlock(20*time.Millisecond),
		redisstream.WithClaimIdle(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the XACK failed", func() bool { return c.Stats().SettleFailed == 1 })
	waitFor(t, 10*time.Second, "a failed read reported", func() bool { return c.Stats().FetchErrors > 0 })
	srv.start(t)
	publish(t, rdb, stream, orders[1], time.Now().Add(-time.Minute))
	waitFor(t, 20*time.Second, "both entries settled", func() bool {
		s := c.Stats()
		return s.Applied == 2 && s.Duplicates == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	dup := ev.of(adapter.EventDuplicate)[0]
	if d := dup.Detail.(*redisstream.Delivery); d.ID != first || d.Count != 2 {
		t.Fatalf("the duplicate %+v, want entry %s re-claimed on its second delivery", d, first)
	}
	if n := pending(t, rdb, stream); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, orders)
}
