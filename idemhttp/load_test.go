package idemhttp_test

import (
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/txclaim/idempotent/idemhttp"
)

// cuttingProxy forwards loopback TCP connections to target and cuts some:
// a cut request never reaches the handler whole; a cut response is dropped
// after the server has answered (and so committed), which is the case an
// idempotency key exists for.
type cuttingProxy struct {
	ln                    net.Listener
	target                string
	mu                    sync.Mutex
	rnd                   *rand.Rand
	cutRequests, cutResps atomic.Int64
}

func newCuttingProxy(t *testing.T, target string, seed uint64) *cuttingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target, rnd: rand.New(rand.NewPCG(seed, 1))}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

func (p *cuttingProxy) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	p.mu.Lock()
	roll := p.rnd.Float64()
	p.mu.Unlock()
	switch {
	case roll < 0.1: // cut the request: forward a few bytes of it, then hang up
		p.cutRequests.Add(1)
		buf := make([]byte, 16)
		if n, err := io.ReadFull(client, buf); err == nil {
			_, _ = server.Write(buf[:n])
		}
		return
	case roll < 0.3: // cut the response: the server answers, the client never hears
		p.cutResps.Add(1)
		go func() { _, _ = io.Copy(server, client) }()
		_, _ = server.Read(make([]byte, 1))
		return
	}
	go func() { _, _ = io.Copy(server, client) }()
	_, _ = io.Copy(client, server)
}

// TestLoadThroughCuttingProxy sends 1,000 orders, each under its own key,
// through a proxy that cuts 30% of the connections; a client retries each
// order until it has an answer, and sends 30% of them once more after it.
// The audit: exactly one effect per order, every retry of an order answered
// with the first answer's bytes.
func TestLoadThroughCuttingProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	b := openBackend(t, "postgres")
	a := &app{b: b}
	_, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(a))
	p := newCuttingProxy(t, s.Listener.Addr().String(), 7)
	url := "http://" + p.ln.Addr().String() + "/orders"
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	const orders, workers = 1000, 8
	var (
		replays, errs, conflicts atomic.Int64
		next                     atomic.Int64
		wg                       sync.WaitGroup
	)
	answers := make([]string, orders)
	until := func(key, order string) (response, bool) {
		for range 100 {
			r, err := post(t, c, url, key, order, `{"n":1}`)
			if err != nil {
				errs.Add(1)
				continue
			}
			if r.status == http.StatusConflict {
				conflicts.Add(1)
				continue
			}
			if r.replayed {
				replays.Add(1)
			}
			return r, true
		}
		t.Errorf("order %s: no answer in 100 attempts", order)
		return response{}, false
	}
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= orders {
					return
				}
				key, order := "load-"+strconv.Itoa(i), "o-"+strconv.Itoa(i)
				r, ok := until(key, order)
				if !ok {
					return
				}
				if r.status != http.StatusCreated {
					t.Errorf("order %d: %d %s", i, r.status, r.body)
				}
				answers[i] = r.body
				if i%10 < 3 { // the deliberate retries
					again, ok := until(key, order)
					if ok && (!again.replayed || again.body != r.body) {
						t.Errorf("order %d: retry replayed=%v %q, want %q", i, again.replayed, again.body, r.body)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := b.count(t, ""); n != orders {
		t.Errorf("%d effects, want %d", n, orders)
	}
	var dup int
	if err := b.db.QueryRow("SELECT count(*) FROM (SELECT k FROM " + b.effects + " GROUP BY k HAVING count(*) > 1) d").Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Errorf("%d orders applied more than once", dup)
	}
	for i, body := range answers {
		if body == "" {
			t.Errorf("order %d: no answer", i)
			break
		}
	}
	if p.cutResps.Load() == 0 || p.cutRequests.Load() == 0 || replays.Load() < orders*3/10 {
		t.Errorf("the proxy cut %d requests and %d responses, %d replays: the test did not test", p.cutRequests.Load(), p.cutResps.Load(), replays.Load())
	}
	t.Logf("%d orders, %d handler runs, %d replays, %d transport errors, %d conflicts; cut %d requests, %d responses",
		orders, a.calls.Load(), replays.Load(), errs.Load(), conflicts.Load(), p.cutRequests.Load(), p.cutResps.Load())
}
