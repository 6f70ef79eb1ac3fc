package idemhttp_test

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/idemhttp"
)

// TestBareKeyAsSent: a bare key is the bytes the client sent. Keys that
// differ only by a Unicode space (U+00A0, U+2003, U+3000), which HTTP does
// not strip, are different keys: each its own claim and its own run. The
// ASCII white space HTTP strips around a field value (SP and HTAB) is not
// part of the key, whether net/http's HTTP/1 reader stripped it or the
// request reached the middleware with it (as HTTP/2 may deliver it).
func TestBareKeyAsSent(t *testing.T) {
	b := openBackend(t, "postgres")
	a := &app{b: b}
	_, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(a))
	c := s.Client()

	keys := []string{"order-a9ad36", "order-a9ad36\u00a0", "\u2003order-a9ad36", "order-a9ad36\u3000"}
	for i, k := range keys {
		order := "o-" + string(rune('a'+i))
		r := mustPost(t, c, s.URL, k, order, `{}`)
		if r.status != http.StatusCreated || r.replayed {
			t.Errorf("key %q: %d replayed=%v, want a fresh 201 (its own claim)", k, r.status, r.replayed)
		}
		if n := b.count(t, order); n != 1 {
			t.Errorf("key %q: %d effects of %s, want 1", k, n, order)
		}
	}
	if n := a.calls.Load(); n != int64(len(keys)) {
		t.Errorf("%d runs for %d keys that differ by a Unicode space, want %d", n, len(keys), len(keys))
	}

	runs := a.calls.Load()

	// ASCII OWS on the wire: net/http's reader strips it, the key is the first one.
	conn, err := net.Dial("tcp", s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \t order-a9ad36 \t\r\nX-Order: o-a\r\n" +
		"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
	if _, err := conn.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || res.Header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("the first key with SP and HTAB around it on the wire: %d replayed=%q, want its replay", res.StatusCode, res.Header.Get(idemhttp.ReplayedHeader))
	}

	// ASCII OWS in the value the middleware gets: stripped by the middleware.
	for _, v := range []string{" order-a9ad36", "order-a9ad36\t", " \t\"order-a9ad36\"\t "} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
		req.Header["Idempotency-Key"] = []string{v}
		req.Header.Set("X-Order", "o-a")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.Wrap(a).ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.ReplayedHeader) != "true" {
			t.Errorf("value %q: %d replayed=%q, want the first key's replay", v, rec.Code, rec.Header().Get(idemhttp.ReplayedHeader))
		}
	}
	if n := a.calls.Load(); n != runs {
		t.Errorf("%d runs after %d: a key with ASCII white space around it ran again", n, runs)
	}
}
