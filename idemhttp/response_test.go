package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/txclaim/idempotent/idemhttp"
)

// writeErrors keeps the errors of a handler's Write calls, by run.
type writeErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *writeErrors) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *writeErrors) take() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	errs := e.errs
	e.errs = nil
	return errs
}

// TestResponseAsNetHTTP: a protected handler's response, fresh and
// replayed, is the one net/http sends for the same handler without the
// middleware — status, the header fields a client sees, body, and what
// the handler's Writes return — in the cases where net/http's
// ResponseWriter decides something the handler did not say: the sniffed
// Content-Type (not under a Content-Encoding, from the body's first bytes
// across Writes, not when the handler suppressed it), a status without a
// body, header fields set after the status was written.
func TestResponseAsNetHTTP(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("hello, gzip"))
	_ = zw.Close()
	werr := &writeErrors{}
	write := func(w http.ResponseWriter, p string) {
		_, err := w.Write([]byte(p))
		werr.add(err)
	}
	for _, c := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"gzip body without a type", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			write(w, gz.String())
		}},
		{"type sniffed across writes", func(w http.ResponseWriter, r *http.Request) {
			write(w, "<")
			write(w, "html><body>hi</body></html>")
		}},
		{"type suppressed", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			write(w, "<html><body>hi</body></html>")
		}},
		{"204 with a body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			write(w, "<html>")
		}},
		{"fields set after the status", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("Location", "/orders/late")
			w.Header().Set("Content-Type", "text/plain")
			write(w, `{}`)
		}},
		{"fields set after the first write", func(w http.ResponseWriter, r *http.Request) {
			write(w, `{"a":`)
			w.Header().Set("Location", "/orders/late")
			write(w, `1}`)
		}},
		{"nothing written", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/1")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bare := server(t, c.h)
			want := mustPost(t, bare.Client(), bare.URL, "", "o", `{}`)
			wantErrs := werr.take()

			b := openBackend(t, "sqlite")
			_, h := b.middleware(t, idemhttp.GlobalScope)
			s := server(t, h.Wrap(c.h))
			first := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
			if errs := werr.take(); !slices.EqualFunc(errs, wantErrs, func(a, b error) bool { return errors.Is(a, b) }) {
				t.Errorf("the handler's Writes returned %v, net/http's %v", errs, wantErrs)
			}
			again := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
			if !again.replayed {
				t.Fatalf("the retry is no replay: %d %s", again.status, again.body)
			}
			for name, got := range map[string]response{"fresh": first, "replay": again} {
				if got.status != want.status || got.body != want.body {
					t.Errorf("%s: %d %q, net/http answers %d %q", name, got.status, got.body, want.status, want.body)
				}
				for _, f := range []string{"Content-Type", "Content-Encoding", "Content-Length", "Location"} {
					if g, w := got.header[f], want.header[f]; !slices.Equal(g, w) {
						t.Errorf("%s: %s %q, net/http sends %q", name, f, g, w)
					}
				}
			}
		})
	}
}

// TestInvalidStatusRollsBack: a handler that writes a status outside
// 100–999 panics there, as on net/http, so its effect rolls back and the
// key stays free: a status below 100 is not dropped as if it were a 1xx,
// and a status past 999 is not stored by WithStoredServerErrors, to make
// every retry of a committed request fail.
func TestInvalidStatusRollsBack(t *testing.T) {
	for _, c := range []struct {
		status int
		opts   []idemhttp.Option
	}{
		{42, nil},
		{1000, []idemhttp.Option{idemhttp.WithStoredServerErrors()}},
	} {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			b := openBackend(t, "sqlite")
			a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
				w.WriteHeader(c.status)
				return true
			}}
			_, h := b.middleware(t, idemhttp.GlobalScope, c.opts...)
			s := server(t, h.Wrap(a))
			for i := range 2 {
				if r, err := post(t, s.Client(), s.URL, "k", "o", `{}`); err == nil {
					t.Errorf("request %d: answered %d %s, want the dropped connection of a panic", i, r.status, r.body)
				}
			}
			if n := b.count(t, ""); n != 0 || a.calls.Load() != 2 {
				t.Errorf("%d effects after %d runs, want 0 after 2 (each run rolled back, the key free)", n, a.calls.Load())
			}
		})
	}
}

// TestNoPrincipal: a request whose ScopeFunc fails is a 403 problem,
// without a WWW-Authenticate a 401 would need; WithChallenge makes it a
// 401 carrying the challenge. The handler does not run.
func TestNoPrincipal(t *testing.T) {
	b := openBackend(t, "sqlite")
	a := &app{b: b}
	noOne := func(*http.Request) (string, error) { return "", errors.New("no principal") }
	for _, c := range []struct {
		opts      []idemhttp.Option
		status    int
		challenge string
	}{
		{nil, http.StatusForbidden, ""},
		{[]idemhttp.Option{idemhttp.WithChallenge(`Bearer realm="orders"`), idemhttp.WithResponseTable("challenged")}, http.StatusUnauthorized, `Bearer realm="orders"`},
	} {
		_, h := b.middleware(t, noOne, c.opts...)
		s := server(t, h.Wrap(a))
		r := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
		if r.status != c.status || r.header.Get("WWW-Authenticate") != c.challenge || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%d WWW-Authenticate %q %s, want %d %q and a problem", r.status, r.header.Get("WWW-Authenticate"), r.body, c.status, c.challenge)
		}
	}
	if n := a.calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times without a principal", n)
	}
	mw, _ := b.middleware(t, noOne)
	for _, bad := range []string{"", " \t", "Bearer\r\nX-Injected: 1", "Basic\x00"} {
		if _, err := idemhttp.New(mw, noOne, idemhttp.WithChallenge(bad)); err == nil || !strings.Contains(err.Error(), "WithChallenge") {
			t.Errorf("WithChallenge(%q): %v, want its refusal", bad, err)
		}
	}
}
