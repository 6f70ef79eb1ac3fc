package idempgx_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// benchDSN returns the benchmarks' database: the test database, or, when
// BENCH_PG_LATENCY holds a duration (e.g. 250us), a proxy in front of it
// that delays every byte by that much in each direction, as a network with
// that one-way latency would. On loopback a round trip costs a few
// microseconds and the server's own work decides the rate; across a network
// every round trip the pgx path saves is worth a whole round-trip time.
func benchDSN(b testing.TB) string {
	b.Helper()
	d := dsn(b)
	v := os.Getenv("BENCH_PG_LATENCY")
	if v == "" {
		return d
	}
	lat, err := time.ParseDuration(v)
	if err != nil || lat < 0 {
		b.Fatalf("BENCH_PG_LATENCY=%q: want a duration such as 250us", v)
	}
	u, err := url.Parse(d)
	if err != nil {
		b.Fatalf("BENCH_PG_LATENCY needs a URL DSN: %v", err)
	}
	u.Host = latencyProxy(b, u.Host, lat)
	return u.String()
}

// roundTrip returns the median time of a SELECT 1 on one connection to d:
// what the proxy's delays come to, timers' granularity included.
func roundTrip(b testing.TB, d string) time.Duration {
	b.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, d)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	ts := make([]time.Duration, 21)
	for i := range ts {
		start := time.Now()
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			b.Fatal(err)
		}
		ts[i] = time.Since(start)
	}
	slices.Sort(ts)
	return ts[len(ts)/2]
}

// latencyProxy forwards the connections it accepts on a loopback port to
// target, delaying each chunk of bytes by d in each direction, in order.
// It returns its address and stops in Cleanup.
func latencyProxy(t testing.TB, target string, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); delayCopy(s, c, d) }()
			go func() { defer wg.Done(); delayCopy(c, s, d) }()
		}
	}()
	return ln.Addr().String()
}

// delayCopy copies src to dst, each chunk written d after it was read.
func delayCopy(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if w := time.Until(c.due); w > 0 {
			time.Sleep(w) // the simulated network, not synchronisation
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	for range q { // let the reader end
	}
}
