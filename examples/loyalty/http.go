//go:build loyalty_http

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
)

// The HTTP part: -http.
func init() { httpDemo = demoHTTP }

// The HTTP mode (-http): the loyalty service is an HTTP API that credits
// an order's points, POST /credits with the order as JSON, and its
// clients send each order with an Idempotency-Key, retrying on a timeout,
// a lost connection, a 409 or a 5xx with the same key. Between them a
// loopback proxy, standing for a load balancer, injects the faults.

// httpFaults configures what goes wrong in the HTTP mode.
type httpFaults struct {
	// loseEvery makes the proxy cut every loseEvery-th response: the
	// server committed and answered, and the client never hears of it.
	loseEvery int
	// drops is how many times, spread over the load, the proxy closes
	// every client connection it holds.
	drops int
	// slowEvery slows every slowEvery-th request's price lookup to slow,
	// past the client's timeout.
	slowEvery int
	slow      time.Duration
	// timeout is the client's timeout per attempt.
	timeout time.Duration
}

var defaultHTTPFaults = httpFaults{loseEvery: 250, drops: 3, slowEvery: 100, slow: 150 * time.Millisecond, timeout: 100 * time.Millisecond}

// demoHTTP runs the HTTP mode twice, prints the audit and returns the
// results.
func demoHTTP(ctx context.Context, o options, st *store, ld load, out io.Writer) ([]result, error) {
	f := defaultHTTPFaults
	fmt.Fprintf(out, "loyalty: %d orders credited over HTTP (POST /credits), %d client processes x %d workers\n", ld.orders, o.consumers, o.workers)
	fmt.Fprintf(out, "  database  %s\n", st.desc)
	fmt.Fprintf(out, "  API       net/http on loopback behind a proxy; clients time out after %s and retry with the same Idempotency-Key\n", f.timeout)
	fmt.Fprintf(out, "  faults    a response cut after the commit every %d requests; every client connection dropped %d times;\n", f.loseEvery, f.drops)
	fmt.Fprintf(out, "            every %dth request slowed to %s, past the client's timeout; %d orders sent twice (two workers at once);\n", f.slowEvery, f.slow, ld.twice)
	fmt.Fprintf(out, "            %d old orders sent again \"3 weeks later\", with their keys\n\n", len(ld.replay))
	pr := newProgressPrinter(out)
	var results []result
	for _, newImpl := range []func(context.Context, int) (httpImpl, error){st.naiveHTTP, st.libraryHTTP} {
		impl, err := newImpl(ctx, ld.customers)
		if err != nil {
			return nil, err
		}
		r, err := runHTTP(ctx, impl, ld, f, o.consumers, o.workers, pr.report)
		if err != nil {
			pr.abort()
			return nil, fmt.Errorf("%s run: %w", impl.name, err)
		}
		results = append(results, r)
	}
	printAudit(out, results)
	return results, nil
}

// httpImpl is one side of the HTTP mode: the API's handler and its audit.
type httpImpl struct {
	name    string
	handler http.Handler
	// duplicate tells the server's counting wrapper whether a response
	// says "already done": the naive check's 200, the library's replay or
	// 409.
	duplicate func(status int, h http.Header) bool
	credited  creditedT
}

// naiveHTTP is the API's handler without the middleware: decode the order,
// check whether it has been credited, then credit it in a transaction of
// its own and answer 201 — or 200 when the check caught a repeat.
func (s *store) naiveHTTP(ctx context.Context, customers int) (httpImpl, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return httpImpl{}, err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o orderCompleted
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		out, err := apply(r.Context(), o)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		status := http.StatusCreated
		if out == idempotent.Duplicate {
			status = http.StatusOK
		}
		writeCredit(w, status, o)
	})
	return httpImpl{name: "naive check-then-act", handler: h, credited: credited,
		duplicate: func(status int, _ http.Header) bool { return status == http.StatusOK }}, nil
}

// libraryHTTP is the same handler through idemhttp: the claim of the
// request's Idempotency-Key, the credit and the stored response in one
// transaction; a retry gets the stored response.
func (s *store) libraryHTTP(ctx context.Context, customers int) (httpImpl, error) {
	balances, ledger, err := s.loyaltyTables(ctx, "idempotent", customers)
	if err != nil {
		return httpImpl{}, err
	}
	claims := s.claimTable()
	var opts []idempotent.Option
	if s.d.Name() != "sqlite" {
		// A retry while the first request is in flight: 409 within a
		// second (SQLite's retry waits for the first instead).
		opts = append(opts, idempotent.WithLockTimeout(time.Second))
	}
	mw, err := idempotent.New(s.db, s.d, "loyalty-api", append(opts, idempotent.WithTable(claims))...)
	if err != nil {
		return httpImpl{}, err
	}
	// One client: every key in one scope. A service with accounts scopes
	// the keys by the authenticated account.
	idem, err := idemhttp.New(mw, idemhttp.GlobalScope)
	if err != nil {
		return httpImpl{}, err
	}
	s.tables = append(s.tables, idem.Table())
	if err := mw.EnsureSchema(ctx); err != nil {
		return httpImpl{}, err
	}
	if err := idem.EnsureSchema(ctx); err != nil {
		return httpImpl{}, err
	}
	h := idem.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o orderCompleted
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		// The middleware opened the claim's transaction before the
		// handler runs, so the price lookup waits inside it here.
		priceLookup(r.Context())
		if err := s.credit(r.Context(), idemhttp.TxFromContext(r.Context()), balances, ledger, o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // a 5xx rolls the claim back
			return
		}
		writeCredit(w, http.StatusCreated, o)
	}))
	return httpImpl{name: "idempotent", handler: h, credited: s.credited(balances),
		duplicate: func(status int, h http.Header) bool {
			return status == http.StatusConflict || h.Get(idemhttp.ReplayedHeader) == "true"
		}}, nil
}

func writeCredit(w http.ResponseWriter, status int, o orderCompleted) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]int64{"order_id": o.OrderID, "points": o.points()})
}

// httpRun is one run of the HTTP mode: the API on a loopback server, the
// fault-injecting proxy in front of it, and the clients.
type httpRun struct {
	impl httpImpl
	f    httpFaults

	served, duplicates, slowed atomic.Int64 // server side
	proxied, lost, drops       atomic.Int64 // proxy side

	settledFlags []atomic.Bool
	settled      atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]bool // the proxy's client connections
}

// serveAPI is the API server's handler: it counts the requests that reach
// the API and those answered "already done", and slows every slowEvery-th.
func (hr *httpRun) serveAPI(w http.ResponseWriter, r *http.Request) {
	n := hr.served.Add(1)
	if hr.f.slowEvery > 0 && n%int64(hr.f.slowEvery) == 0 {
		hr.slowed.Add(1)
		r = r.WithContext(withSlowLookup(r.Context(), hr.f.slow))
	}
	rec := &statusRecorder{ResponseWriter: w}
	hr.impl.handler.ServeHTTP(rec, r)
	if hr.impl.duplicate(rec.status, w.Header()) {
		hr.duplicates.Add(1)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// proxy is the load balancer's handler. It passes each request on to the
// API with a context of its own, so a client that gave up does not stop
// the request it sent (as a load balancer that buffers requests does
// not); and every loseEvery-th response, which the API committed and
// answered, it cuts: the client's connection closes before a byte of it
// arrives.
func (hr *httpRun) proxy(upstream *http.Client, target string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client went away
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := upstream.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		respBody, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if n := hr.proxied.Add(1); hr.f.loseEvery > 0 && n%int64(hr.f.loseEvery) == 0 {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				hr.lost.Add(1)
				_ = conn.Close()
				return
			}
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(respBody)
	})
}

// trackConn keeps the proxy's client connections, for dropAll.
func (hr *httpRun) trackConn(c net.Conn, st http.ConnState) {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	switch st {
	case http.StateNew:
		hr.conns[c] = true
	case http.StateClosed, http.StateHijacked:
		delete(hr.conns, c)
	}
}

// dropAll closes every client connection the proxy holds, the requests in
// flight on them included: the network failed.
func (hr *httpRun) dropAll() {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	hr.drops.Add(1)
	for c := range hr.conns {
		_ = c.Close()
	}
}

// settle counts message copy id as confirmed to its client, once.
func (hr *httpRun) settle(id int64) {
	if id >= 0 && int(id) < len(hr.settledFlags) && !hr.settledFlags[id].Swap(true) {
		hr.settled.Add(1)
	}
}

// serve starts a loopback HTTP server with h; stop shuts it down.
func serve(h http.Handler, connState func(net.Conn, http.ConnState)) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	// The cut connections are the scenario's faults: nothing to log.
	srv := &http.Server{Handler: h, ConnState: connState, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(ln) }()
	var once sync.Once
	return "http://" + ln.Addr().String(), func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close()
			}
		})
	}, nil
}

// errNotCredited is a client's failure to have an order credited.
var errNotCredited = errors.New("order not credited")

// sendOrder sends one order until the API confirms it (2xx), with the
// same Idempotency-Key on every attempt; a timeout, a lost connection, a
// 409 or a 5xx is retried after a backoff (Retry-After when given).
func sendOrder(ctx context.Context, c *http.Client, url string, m amqp.Publishing) error {
	key := "order-" + orderIDOf(m.Body)
	backoff := 10 * time.Millisecond
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/credits", bytes.NewReader(m.Body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultHeader, key)
		wait := backoff
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			switch {
			case resp.StatusCode < 300:
				return nil
			case resp.StatusCode != http.StatusConflict && resp.StatusCode < 500:
				return fmt.Errorf("%w: %s answered %s", errNotCredited, key, resp.Status)
			}
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				wait = time.Duration(s) * time.Second
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// orderIDOf returns the order id in an order's JSON.
func orderIDOf(body []byte) string {
	var o orderCompleted
	_ = json.Unmarshal(body, &o)
	return strconv.FormatInt(o.OrderID, 10)
}

// runHTTP runs the load once through impl: clients × workers senders, each
// taking the next order from the load, in order (so that an order sent
// twice goes to two senders at once).
func runHTTP(ctx context.Context, impl httpImpl, ld load, f httpFaults, clients, workers int, report func(progress)) (result, error) {
	hr := &httpRun{impl: impl, f: f, conns: map[net.Conn]bool{},
		settledFlags: make([]atomic.Bool, len(ld.main)+len(ld.replay))}
	apiURL, stopAPI, err := serve(http.HandlerFunc(hr.serveAPI), nil)
	if err != nil {
		return result{}, fmt.Errorf("API server: %w", err)
	}
	defer stopAPI()
	upstream := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * clients * workers}}
	defer upstream.CloseIdleConnections()
	proxyURL, stopProxy, err := serve(hr.proxy(upstream, apiURL), hr.trackConn)
	if err != nil {
		return result{}, fmt.Errorf("proxy: %w", err)
	}
	defer stopProxy()

	start := time.Now()
	p := progress{name: impl.name, total: len(ld.main) + len(ld.replay), crashWord: "cut"}
	snapshot := func(done bool) {
		p.settled, p.deliveries, p.crashes, p.drops, p.elapsed, p.done = int(hr.settled.Load()), hr.served.Load(),
			hr.lost.Load(), hr.drops.Load(), time.Since(start), done
		report(p)
	}
	sendAll := func(msgs []amqp.Publishing, dropAt []int) error {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		jobs := make(chan amqp.Publishing)
		errs := make(chan error, clients*workers)
		var wg sync.WaitGroup
		for range clients {
			// One client process: its own connections, its workers.
			c := &http.Client{Timeout: f.timeout, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
			defer c.CloseIdleConnections()
			for range workers {
				wg.Go(func() {
					for m := range jobs {
						if err := sendOrder(rctx, c, proxyURL, m); err != nil {
							errs <- err
							cancel()
							return
						}
						id, _ := m.Headers[copyHeader].(int64)
						hr.settle(id)
					}
				})
			}
		}
		// The progress line, and the drops once their points pass.
		watching := make(chan struct{})
		var watcher sync.WaitGroup
		watcher.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; {
				for k < len(dropAt) && int(hr.settled.Load()) >= dropAt[k] {
					hr.dropAll()
					k++
				}
				snapshot(false)
				select {
				case <-watching:
					return
				case <-tick.C:
				}
			}
		})
	feed:
		for _, m := range msgs {
			select {
			case jobs <- m:
			case <-rctx.Done():
				break feed
			}
		}
		close(jobs)
		wg.Wait()
		close(watching)
		watcher.Wait()
		select {
		case err := <-errs:
			return err
		default:
		}
		return ctx.Err()
	}
	var dropAt []int
	for k := 1; k <= f.drops; k++ {
		dropAt = append(dropAt, k*len(ld.main)/(f.drops+1))
	}
	if err := sendAll(ld.main, dropAt); err != nil {
		return result{}, err
	}
	// Weeks later: the client sends old orders again from its outbox,
	// each with the key it was sent with.
	if err := sendAll(ld.replay, nil); err != nil {
		return result{}, err
	}
	stopProxy()
	stopAPI() // the requests the clients gave up on finish here
	r := result{name: impl.name, orders: ld.orders, deliveries: hr.served.Load(), duplicates: hr.duplicates.Load(),
		expected: ld.expected, crashes: hr.lost.Load(), drops: hr.drops.Load(), elapsed: time.Since(start)}
	if r.credited, err = impl.credited(ctx); err != nil {
		return result{}, fmt.Errorf("audit: %w", err)
	}
	snapshot(true)
	return r, nil
}
