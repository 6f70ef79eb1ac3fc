// Package latencyproxy puts a TCP proxy in front of a database that delays
// every chunk of bytes by a fixed time in each direction, as a network with
// that one-way latency would. On loopback a round trip to PostgreSQL costs
// tens of microseconds and the server's own work decides the rate; through
// the proxy every round trip a code path saves is worth a whole round-trip
// time, which is what it is worth across a real network.
//
// The bench command's -pgx -latency and -coalesce -latency modes run through it.
package latencyproxy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Proxy forwards the connections it accepts on a loopback port to a
// target, delaying each chunk of bytes by a fixed time in each direction,
// in order.
type Proxy struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// Start listens on a loopback port and forwards what it accepts to target
// (host:port), each chunk of bytes delayed by d in each direction.
func Start(target string, d time.Duration) (*Proxy, error) {
	if d < 0 {
		return nil, fmt.Errorf("latencyproxy: negative delay %v", d)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("latencyproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
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
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); delayCopy(s, c, d) }()
			go func() { defer p.wg.Done(); delayCopy(c, s, d) }()
		}
	}()
	return p, nil
}

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every forwarded connection and waits for
// the proxy's goroutines to end.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// DSN starts a proxy delaying each direction by d in front of the server of
// the URL DSN dsn and returns the DSN that goes through it.
func DSN(dsn string, d time.Duration) (string, *Proxy, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", nil, fmt.Errorf("latencyproxy: the DSN must be a URL (postgres://host:port/…): %w", err)
	}
	if u.Host == "" {
		return "", nil, fmt.Errorf("latencyproxy: the DSN %q names no host:port; use a URL DSN (postgres://host:port/…)", dsn)
	}
	p, err := Start(u.Host, d)
	if err != nil {
		return "", nil, err
	}
	u.Host = p.Addr()
	return u.String(), p, nil
}

// RoundTrip returns the median time of a SELECT 1 on one connection to dsn
// (of 21): what the proxy's delays come to, timers' granularity included.
func RoundTrip(ctx context.Context, dsn string) (time.Duration, error) {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, fmt.Errorf("latencyproxy: round trip: %w", err)
	}
	defer func() { _ = c.Close(ctx) }()
	ts := make([]time.Duration, 21)
	for i := range ts {
		start := time.Now()
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			return 0, fmt.Errorf("latencyproxy: round trip: %w", err)
		}
		ts[i] = time.Since(start)
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
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
