package idemhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
)

// TestFirstRequestAndReplay: the first request runs the handler once and
// stores its response; a retry gets it byte for byte, with the stored
// header fields only and the replay header, without running the handler.
func TestFirstRequestAndReplay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		c := s.Client()

		first := mustPost(t, c, s.URL+"/orders", "k-1", "o-1", `{"n":1}`)
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("first: %d replayed=%v %s", first.status, first.replayed, first.body)
		}
		if first.header.Get("Set-Cookie") == "" {
			t.Error("the first response lost the handler's Set-Cookie")
		}
		for i := range 2 {
			again := mustPost(t, c, s.URL+"/orders", "k-1", "o-1", `{"n":1}`)
			if again.status != http.StatusCreated || !again.replayed || again.body != first.body {
				t.Fatalf("retry %d: %d replayed=%v %q, want 201 replayed %q", i, again.status, again.replayed, again.body, first.body)
			}
			if again.header.Get("Location") != "/orders/o-1" || again.header.Get("Content-Type") != "application/json" {
				t.Errorf("retry %d: stored header fields not replayed: %v", i, again.header)
			}
			if again.header.Get("Set-Cookie") != "" {
				t.Errorf("retry %d replayed Set-Cookie, which is not a stored field", i)
			}
		}
		// The sf-string form of the same key is the same key.
		quoted := mustPost(t, c, s.URL+"/orders", `"k-1"`, "o-1", `{"n":1}`)
		if !quoted.replayed || quoted.body != first.body {
			t.Errorf("quoted key: %d replayed=%v, want the replay", quoted.status, quoted.replayed)
		}
		if n := a.calls.Load(); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
		if n := b.count(t, "o-1"); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
		// Unprotected methods pass through, without a key and without a tx.
		get := mustGet(t, c, s.URL+"/orders")
		if get != http.StatusInternalServerError { // app refuses to run without a tx
			t.Errorf("GET: %d, want the handler's own 500 (no claim transaction)", get)
		}
	})
}

func mustGet(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	res, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestBadKeys: a missing, doubled, malformed or unclaimable key is a 400
// problem and nothing runs.
func TestBadKeys(t *testing.T) {
	b := openBackend(t, "sqlite")
	a := &app{b: b}
	mw, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(a))
	c := s.Client()
	long := strings.Repeat("k", mw.Config().Dialect.MaxKeyBytes())
	for name, key := range map[string]string{
		"missing":      "",
		"too long":     long,
		"invalid utf8": "k\xff\xfe",
		"bad sf":       `"unterminated`,
		"empty sf":     `""`,
	} {
		r := mustPost(t, c, s.URL, key, "o", "{}")
		if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s %s, want 400 application/problem+json", name, r.status, r.header.Get("Content-Type"), r.body)
		}
	}
	// Two values, and a NUL (which no client library sends), straight in.
	for name, values := range map[string][]string{"two": {"a", "b"}, "nul": {"a\x00b"}} {
		req, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		req.Header["Idempotency-Key"] = values
		rec := httptest.NewRecorder()
		h.Wrap(a).ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, rec.Code)
		}
	}
	if n := a.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times for bad keys", n)
	}
}

// TestConcurrentRetries: 32 clients send the same key at once. While the
// first is in flight the others get 409 with Retry-After within the lock
// timeout (the handler does not finish until 31 of them have), then
// replays; on SQLite, which cannot bound the wait, they wait and get
// replays. One effect, one fresh 201.
func TestConcurrentRetries(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const clients = 32
		var conflicts atomic.Int64
		enough := make(chan struct{})
		var once sync.Once
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			if b.busy {
				select {
				case <-enough:
				case <-time.After(20 * time.Second):
					http.Error(w, "the others were never answered 409", http.StatusInternalServerError)
					return true
				}
			}
			return false
		}}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		c := s.Client()
		c.Transport.(*http.Transport).MaxIdleConnsPerHost = clients

		results := make([]response, clients)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range clients {
			wg.Go(func() {
				<-start
				counted := false
				for {
					r, err := post(t, c, s.URL, "hot", "o-hot", `{"n":1}`)
					if err != nil {
						t.Error(err)
						return
					}
					if r.status != http.StatusConflict {
						results[i] = r
						return
					}
					if r.header.Get("Retry-After") != "1" {
						t.Errorf("409 with Retry-After %q", r.header.Get("Retry-After"))
					}
					if !counted {
						counted = true
						if conflicts.Add(1) == clients-1 {
							once.Do(func() { close(enough) })
						}
					}
				}
			})
		}
		close(start)
		wg.Wait()
		fresh, replays := 0, 0
		var body string
		for i, r := range results {
			switch {
			case r.status == http.StatusCreated && !r.replayed:
				fresh++
				body = r.body
			case r.status == http.StatusCreated && r.replayed:
				replays++
			default:
				t.Errorf("client %d: %d %s", i, r.status, r.body)
			}
		}
		for i, r := range results {
			if r.body != body {
				t.Errorf("client %d got %q, want %q", i, r.body, body)
			}
		}
		if fresh != 1 || replays != clients-1 {
			t.Errorf("%d fresh 201s and %d replays, want 1 and %d", fresh, replays, clients-1)
		}
		if b.busy && conflicts.Load() < clients-1 {
			t.Errorf("%d clients saw a 409, want %d", conflicts.Load(), clients-1)
		}
		if n := b.count(t, "o-hot"); n != 1 || a.calls.Load() != 1 {
			t.Errorf("%d effects, %d handler runs, want 1 and 1", n, a.calls.Load())
		}
	})
}

// TestFingerprintMismatch: the same key with another body, path or method
// is a 422; nothing is written, and the stored response stays.
func TestFingerprintMismatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		c := s.Client()
		first := mustPost(t, c, s.URL+"/orders", "k", "o", `{"n":1}`)
		for name, r := range map[string]response{
			"body":         mustPost(t, c, s.URL+"/orders", "k", "o", `{"n":2}`),
			"path":         mustPost(t, c, s.URL+"/refunds", "k", "o", `{"n":1}`),
			"query":        mustPost(t, c, s.URL+"/orders?dry=1", "k", "o", `{"n":1}`),
			"content type": mustPost(t, c, s.URL+"/orders", "k", "o", `{"n":1}`, "Content-Type", "text/plain"),
			"method":       mustSend(t, c, http.MethodPatch, s.URL+"/orders", "k", "o", `{"n":1}`),
		} {
			if r.status != http.StatusUnprocessableEntity || r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: %d %s, want 422 problem", name, r.status, r.body)
			}
		}
		if again := mustPost(t, c, s.URL+"/orders", "k", "o", `{"n":1}`); !again.replayed || again.body != first.body {
			t.Errorf("the original request after mismatches: %d replayed=%v", again.status, again.replayed)
		}
		if n := b.count(t, ""); n != 1 || a.calls.Load() != 1 {
			t.Errorf("%d effects, %d handler runs, want 1 and 1", n, a.calls.Load())
		}
	})
}

func mustSend(t *testing.T, c *http.Client, method, url, key, order, body string) response {
	t.Helper()
	r, err := send(t, c, method, url, key, order, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestScopes: a client that sends another client's key, with the same
// request, runs the handler for itself and never sees the other's
// response; a request without a principal is a 403 (TestNoPrincipal).
func TestScopes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b}
		scope := func(r *http.Request) (string, error) {
			if c := r.Header.Get("X-Client"); c != "" {
				return c, nil
			}
			return "", errors.New("no client")
		}
		_, h := b.middleware(t, scope)
		s := server(t, h.Wrap(a))
		c := s.Client()
		alice := mustPost(t, c, s.URL, "shared-key", "o-a", `{"n":1}`, "X-Client", "alice")
		mallory := mustPost(t, c, s.URL, "shared-key", "o-a", `{"n":1}`, "X-Client", "mallory")
		if mallory.replayed || mallory.body == alice.body || mallory.status != http.StatusCreated {
			t.Fatalf("mallory with alice's key: %d replayed=%v %q (alice got %q)", mallory.status, mallory.replayed, mallory.body, alice.body)
		}
		// A different body from another scope is not a 422 either: that
		// would tell mallory the key is in use.
		other := mustPost(t, c, s.URL, "shared-key", "o-m", `{"n":9}`, "X-Client", "eve")
		if other.status != http.StatusCreated || other.replayed {
			t.Errorf("eve with alice's key and another body: %d replayed=%v", other.status, other.replayed)
		}
		// Scopes that would concatenate to the same claim key stay apart.
		x := mustPost(t, c, s.URL, "b:c", "o-x", `{}`, "X-Client", "a")
		y := mustPost(t, c, s.URL, "c", "o-x", `{}`, "X-Client", "a:b")
		if y.replayed || x.body == y.body {
			t.Errorf("scope a key b:c and scope a:b key c share a claim")
		}
		if again := mustPost(t, c, s.URL, "shared-key", "o-a", `{"n":1}`, "X-Client", "alice"); again.body != alice.body || !again.replayed {
			t.Errorf("alice's retry: %d replayed=%v", again.status, again.replayed)
		}
		if r := mustPost(t, c, s.URL, "shared-key", "o-a", `{"n":1}`); r.status != http.StatusForbidden {
			t.Errorf("no principal: %d, want 403", r.status)
		}
		if n := b.count(t, ""); n != 5 {
			t.Errorf("%d effects, want 5 (alice, mallory, eve, a, a:b)", n)
		}
	})
}

// TestServerErrorFreesKey: a 5xx and a panic roll the effect back and store
// nothing, so the retry applies once; with WithStoredServerErrors a 5xx
// is stored and replayed.
func TestServerErrorFreesKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			switch {
			case call == 1:
				http.Error(w, "upstream down", http.StatusBadGateway)
				return true
			case call == 2:
				panic("handler bug")
			}
			return false
		}}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		c := s.Client()
		if r := mustPost(t, c, s.URL, "k", "o", `{}`); r.status != http.StatusBadGateway || r.body != "upstream down\n" {
			t.Fatalf("first: %d %q, want the handler's 502", r.status, r.body)
		}
		if n := b.count(t, ""); n != 0 {
			t.Fatalf("a 502 committed %d effects", n)
		}
		if _, err := post(t, c, s.URL, "k", "o", `{}`); err == nil {
			t.Fatal("a panicking handler answered")
		}
		if n := b.count(t, ""); n != 0 {
			t.Fatalf("a panic committed %d effects", n)
		}
		ok := mustPost(t, c, s.URL, "k", "o", `{}`)
		again := mustPost(t, c, s.URL, "k", "o", `{}`)
		if ok.status != http.StatusCreated || ok.replayed || !again.replayed || again.body != ok.body {
			t.Errorf("after the failures: %d replayed=%v, then %d replayed=%v", ok.status, ok.replayed, again.status, again.replayed)
		}
		if n := b.count(t, ""); n != 1 || a.calls.Load() != 3 {
			t.Errorf("%d effects after %d runs, want 1 after 3", n, a.calls.Load())
		}

		t.Run("stored", func(t *testing.T) {
			a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
				http.Error(w, "charged, then failed", http.StatusInternalServerError)
				return true
			}}
			_, h := b.middleware(t, idemhttp.GlobalScope, idemhttp.WithStoredServerErrors(), idemhttp.WithResponseTable("stored_5xx"))
			s := server(t, h.Wrap(a))
			first := mustPost(t, s.Client(), s.URL, "k5", "o5", `{}`)
			again := mustPost(t, s.Client(), s.URL, "k5", "o5", `{}`)
			if first.status != 500 || again.status != 500 || !again.replayed || again.body != first.body || a.calls.Load() != 1 {
				t.Errorf("stored 500: %d then %d replayed=%v, %d runs", first.status, again.status, again.replayed, a.calls.Load())
			}
			if n := b.count(t, "o5"); n != 1 {
				t.Errorf("%d effects, want the stored 500's 1", n)
			}
		})
	})
}

// TestBodyLimits: a response over the stored limit is a 500 that applies
// nothing (the key stays free); a request over the read limit is a 413.
func TestBodyLimits(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var writeErr atomic.Value
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			if r.URL.Query().Get("big") == "" {
				return false
			}
			_, err := w.Write([]byte(strings.Repeat("x", 2000)))
			writeErr.Store(err)
			return true
		}}
		var logged atomic.Int64
		_, h := b.middleware(t, idemhttp.GlobalScope, idemhttp.WithMaxResponseBody(1000), idemhttp.WithMaxRequestBody(100),
			idemhttp.WithFingerprintHeaders(), idemhttp.WithErrorLog(func(*http.Request, error) { logged.Add(1) }))
		s := server(t, h.Wrap(a))
		c := s.Client()
		if r := mustPost(t, c, s.URL+"/?big=1", "k", "o", `{}`); r.status != http.StatusInternalServerError || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("oversized response: %d %s", r.status, r.body)
		}
		if err, _ := writeErr.Load().(error); !errors.Is(err, idemhttp.ErrResponseTooLarge) {
			t.Errorf("the handler's Write returned %v, want ErrResponseTooLarge", err)
		}
		if n := b.count(t, ""); n != 0 || logged.Load() != 1 {
			t.Errorf("oversized response: %d effects, %d logged errors, want 0 and 1", n, logged.Load())
		}
		if r := mustPost(t, c, s.URL, "k2", "o", strings.Repeat("y", 101)); r.status != http.StatusRequestEntityTooLarge {
			t.Errorf("oversized request: %d, want 413", r.status)
		}
		if a.calls.Load() != 1 {
			t.Errorf("%d runs, want 1 (the oversized request must not run)", a.calls.Load())
		}
		// The key of the failed request is free.
		if r := mustPost(t, c, s.URL+"/?big=", "k", "o", `{}`); r.status != http.StatusCreated || r.replayed {
			t.Errorf("after the oversized response: %d replayed=%v", r.status, r.replayed)
		}
		if n := b.count(t, ""); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
	})
}

// TestStreamingRefused: nothing reaches the client before the commit, so
// Flush, Hijack and deadlines through http.ResponseController fail with
// http.ErrNotSupported, and the writer is no http.Flusher.
func TestStreamingRefused(t *testing.T) {
	b := openBackend(t, "sqlite")
	a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
		rc := http.NewResponseController(w)
		var bad []string
		if err := rc.Flush(); !errors.Is(err, http.ErrNotSupported) {
			bad = append(bad, "Flush")
		}
		if _, _, err := rc.Hijack(); !errors.Is(err, http.ErrNotSupported) {
			bad = append(bad, "Hijack")
		}
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); !errors.Is(err, http.ErrNotSupported) {
			bad = append(bad, "SetWriteDeadline")
		}
		if _, ok := w.(http.Flusher); ok {
			bad = append(bad, "http.Flusher")
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(strings.Join(bad, ",")))
		return true
	}}
	_, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(a))
	if r := mustPost(t, s.Client(), s.URL, "k", "o", "{}"); r.status != http.StatusOK || r.body != "" {
		t.Errorf("%d: supported, want refused: %q", r.status, r.body)
	}
}

// TestNewRefuses: what New will not build on.
func TestNewRefuses(t *testing.T) {
	b := openBackend(t, "postgres")
	newMW := func(opts ...idempotent.Option) *idempotent.Middleware {
		mw, err := idempotent.New(b.db, b.d, "api", append([]idempotent.Option{idempotent.WithTable(b.claims)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	withTimeout := idempotent.WithLockTimeout(time.Second)
	for name, c := range map[string]struct {
		mw    *idempotent.Middleware
		scope idemhttp.ScopeFunc
		opts  []idemhttp.Option
		want  error
	}{
		"partitioned":     {newMW(withTimeout, idempotent.WithDailyPartitions(2)), idemhttp.GlobalScope, nil, idemhttp.ErrPartitioned},
		"no lock timeout": {newMW(), idemhttp.GlobalScope, nil, idemhttp.ErrNoLockTimeout},
		"no scope":        {newMW(withTimeout), nil, nil, nil},
		"bad table":       {newMW(withTimeout), idemhttp.GlobalScope, []idemhttp.Option{idemhttp.WithResponseTable("Bad-Name")}, nil},
		"bad option":      {newMW(withTimeout), idemhttp.GlobalScope, []idemhttp.Option{idemhttp.WithMaxResponseBody(0)}, nil},
		"Set-Cookie":      {newMW(withTimeout), idemhttp.GlobalScope, []idemhttp.Option{idemhttp.WithStoredHeaders("Location", "set-cookie")}, nil},
	} {
		_, err := idemhttp.New(c.mw, c.scope, c.opts...)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want an error matching %v", name, err, c.want)
		}
	}
	if _, err := idemhttp.New(newMW(withTimeout, idempotent.WithDailyPartitions(2)), idemhttp.GlobalScope); !errors.Is(err, adapter.ErrNoProducerEventTime) {
		t.Errorf("partitioned: %v, want an error matching adapter.ErrNoProducerEventTime too", err)
	}
	if _, err := idemhttp.New(newMW(withTimeout), idemhttp.GlobalScope); err != nil {
		t.Errorf("a good configuration: %v", err)
	}
}

// TestNewRefusesPgx: pgxhttp.New refuses what New refuses, from the
// idempgx.Middleware's own configuration.
func TestNewRefusesPgx(t *testing.T) {
	b := openBackend(t, "pgx")
	newMW := func(opts ...idempgx.Option) *idempgx.Middleware {
		m, err := idempgx.New(b.pool, "api", append([]idempgx.Option{idempgx.WithTable(b.claims)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	withTimeout := idempgx.WithLockTimeout(time.Second)
	for name, c := range map[string]struct {
		m     *idempgx.Middleware
		scope idemhttp.ScopeFunc
		want  error
	}{
		"nil":             {nil, idemhttp.GlobalScope, nil},
		"partitioned":     {newMW(withTimeout, idempgx.WithDailyPartitions(2)), idemhttp.GlobalScope, adapter.ErrNoProducerEventTime},
		"no lock timeout": {newMW(), idemhttp.GlobalScope, idemhttp.ErrNoLockTimeout},
		"no scope":        {newMW(withTimeout), nil, nil},
	} {
		_, err := pgxhttp.New(c.m, c.scope)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want an error matching %v", name, err, c.want)
		}
	}
	if _, err := pgxhttp.New(newMW(withTimeout), idemhttp.GlobalScope); err != nil {
		t.Errorf("a good configuration: %v", err)
	}
}

// TestPgxHandlerCommitRefused: the pgx handler's Commit refuses, as
// idempgx's do; the request fails with a 500 the error log hears of
// (idempotent.ErrAutocommit), nothing is stored, and the key stays free.
func TestPgxHandlerCommitRefused(t *testing.T) {
	b := openBackend(t, "pgx")
	var logged atomic.Value
	a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
		if call > 1 {
			return false
		}
		_ = pgxhttp.TxFromContext(r.Context()).Commit(r.Context())
		w.WriteHeader(http.StatusCreated)
		return true
	}}
	_, h := b.middleware(t, idemhttp.GlobalScope, idemhttp.WithErrorLog(func(_ *http.Request, err error) { logged.Store(err) }))
	s := server(t, h.Wrap(a))
	if r := mustPost(t, s.Client(), s.URL, "k", "o", "{}"); r.status != http.StatusInternalServerError {
		t.Fatalf("a handler that commits: %d %s, want 500", r.status, r.body)
	}
	if err, _ := logged.Load().(error); !errors.Is(err, idempotent.ErrAutocommit) {
		t.Errorf("logged %v, want an error matching idempotent.ErrAutocommit", err)
	}
	if n := b.count(t, ""); n != 0 {
		t.Errorf("%d effects after the refused Commit, want 0", n)
	}
	if r := mustPost(t, s.Client(), s.URL, "k", "o", "{}"); r.status != http.StatusCreated || r.replayed || b.count(t, "") != 1 {
		t.Errorf("the retry: %d replayed=%v, want a fresh 201 and 1 effect", r.status, r.replayed)
	}
}

// TestHeaderMethodsOptional: WithHeader, WithMethods and WithOptionalKey.
func TestHeaderMethodsOptional(t *testing.T) {
	b := openBackend(t, "sqlite")
	a := &app{b: b}
	_, h := b.middleware(t, idemhttp.GlobalScope, idemhttp.WithHeader("x-request-key"), idemhttp.WithMethods("put"), idemhttp.WithOptionalKey())
	s := server(t, h.Wrap(a))
	c := s.Client()
	// POST is no longer protected: it runs without a claim (the app's 500).
	if r := mustSend(t, c, http.MethodPost, s.URL, "", "o", "{}"); r.status != http.StatusInternalServerError {
		t.Errorf("POST: %d, want the unprotected handler's 500", r.status)
	}
	// PUT without the key passes through (optional), also without a claim.
	if r := mustSend(t, c, http.MethodPut, s.URL, "", "o", "{}"); r.status != http.StatusInternalServerError {
		t.Errorf("PUT without a key: %d, want the unprotected handler's 500", r.status)
	}
	// PUT with the configured header is protected; Idempotency-Key is not it.
	put := func() response {
		r, err := send(t, c, http.MethodPut, s.URL, "", "o", "{}", "X-Request-Key", "k")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first, again := put(), put()
	if first.status != http.StatusCreated || first.replayed || !again.replayed || again.body != first.body {
		t.Errorf("PUT with X-Request-Key: %d replayed=%v, then replayed=%v", first.status, first.replayed, again.replayed)
	}
	if n := b.count(t, ""); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// TestInvalidScope: a ScopeFunc that returns what the claim table cannot
// hold is the server's fault: 500, reported, nothing run.
func TestInvalidScope(t *testing.T) {
	b := openBackend(t, "sqlite")
	a := &app{b: b}
	var logged atomic.Int64
	long := strings.Repeat("s", idemhttp.MaxScopeBytes+1)
	_, h := b.middleware(t, func(*http.Request) (string, error) { return long, nil },
		idemhttp.WithErrorLog(func(*http.Request, error) { logged.Add(1) }))
	s := server(t, h.Wrap(a))
	if r := mustPost(t, s.Client(), s.URL, "k", "o", "{}"); r.status != http.StatusInternalServerError || logged.Load() != 1 || a.calls.Load() != 0 {
		t.Errorf("invalid scope: %d, %d logged, %d runs; want 500, 1, 0", r.status, logged.Load(), a.calls.Load())
	}
}

// TestClientErrorStored: a 4xx is the request's answer: stored, committed
// with whatever the handler wrote, and replayed.
func TestClientErrorStored(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"title":"out of stock","call":` + strconv.FormatInt(call, 10) + `}`))
			return true
		}}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		first := mustPost(t, s.Client(), s.URL, "k4", "o4", `{}`)
		again := mustPost(t, s.Client(), s.URL, "k4", "o4", `{}`)
		if first.status != http.StatusConflict || first.replayed || again.status != http.StatusConflict || !again.replayed || again.body != first.body {
			t.Errorf("4xx: %d replayed=%v, then %d replayed=%v %q", first.status, first.replayed, again.status, again.replayed, again.body)
		}
		if n := b.count(t, "o4"); n != 1 || a.calls.Load() != 1 {
			t.Errorf("%d effects, %d runs, want 1 and 1", n, a.calls.Load())
		}
	})
}
