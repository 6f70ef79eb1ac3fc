package idemhttp_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
)

// TestDroppedConnection: a client sends its request and hangs up while the
// handler runs. The claim's work goes on without it and commits; the
// client's retry gets the stored response, and the effect happened once.
func TestDroppedConnection(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		entered, release := make(chan struct{}), make(chan struct{})
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			if call == 1 {
				close(entered)
				<-release
			}
			return false
		}}
		_, h := b.middleware(t, idemhttp.GlobalScope)
		done := make(chan struct{}, 1)
		wrapped := h.Wrap(a)
		s := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			wrapped.ServeHTTP(w, r)
			done <- struct{}{}
		}))

		conn, err := net.Dial("tcp", s.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"n":1}`
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: drop\r\nX-Order: o-drop\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		<-entered
		_ = conn.Close()
		close(release)
		<-done

		r := mustPost(t, s.Client(), s.URL+"/orders", "drop", "o-drop", body)
		if r.status != http.StatusCreated || !r.replayed {
			t.Errorf("retry after the hang-up: %d replayed=%v %s, want the stored 201", r.status, r.replayed, r.body)
		}
		if n := b.count(t, "o-drop"); n != 1 || a.calls.Load() != 1 {
			t.Errorf("%d effects, %d runs, want 1 and 1", n, a.calls.Load())
		}
	})
}

// TestRetention: a stored response lives as long as its claim. After the
// claim table's cleanup removed the claim, a retry runs the handler again
// (the client-visible end of the window); Cleanup removes the responses
// whose claims are gone and keeps the others.
func TestRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := &app{b: b}
		mw, h := b.middleware(t, idemhttp.GlobalScope)
		s := server(t, h.Wrap(a))
		c := s.Client()
		ctx := context.Background()
		old := mustPost(t, c, s.URL, "old", "o-old", `{}`)
		mid := time.Now() // after old's claim, before young's: the cleanup's cutoff
		// SQLite stamps a claim in whole milliseconds, truncated: a claim
		// made within the millisecond after mid would read as older than
		// mid. Let that millisecond pass before young's claim (a bounded
		// wait on the clock, not on another goroutine).
		for time.Since(mid) < 2*time.Millisecond {
			runtime.Gosched()
		}
		young := mustPost(t, c, s.URL, "young", "o-young", `{}`)
		b.clock.Set(mid.Add(idempotent.DefaultRetention + idempotent.DefaultClockSkew))

		if _, err := mw.ClaimTable().Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil {
			t.Fatal(err)
		}
		n, err := h.Cleanup(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("Cleanup deleted %d responses, want 1 (the old one)", n)
		}
		if n, err := h.Cleanup(ctx, 0); err != nil || n != 0 {
			t.Errorf("second Cleanup: %d, %v; want 0", n, err)
		}
		if r := mustPost(t, c, s.URL, "young", "o-young", `{}`); !r.replayed || r.body != young.body {
			t.Errorf("young key after cleanup: %d replayed=%v, want its replay", r.status, r.replayed)
		}
		r := mustPost(t, c, s.URL, "old", "o-old", `{}`)
		if r.replayed || r.body == old.body || r.status != http.StatusCreated {
			t.Errorf("old key after its claim's cleanup: %d replayed=%v, want the handler to run again", r.status, r.replayed)
		}
		if n := b.count(t, "o-old"); n != 2 {
			t.Errorf("old key: %d effects, want 2 (the window is over)", n)
		}
		// Without Cleanup, an orphaned response is overwritten by the new
		// claim: the retry of the re-run gets the new response.
		if again := mustPost(t, c, s.URL, "old", "o-old", `{}`); !again.replayed || again.body != r.body {
			t.Errorf("retry of the re-run: replayed=%v %q, want %q", again.replayed, again.body, r.body)
		}
	})
}

// TestOrphanOverwritten: a response left behind by a cleaned claim (no
// Cleanup of the responses) is replaced by the next claim of its key.
func TestOrphanOverwritten(t *testing.T) {
	b := openBackend(t, "postgres")
	a := &app{b: b}
	mw, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(a))
	first := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
	exec(t, b.db, "DELETE FROM "+mw.Config().Table)
	// Younger than the retention window: Cleanup keeps it, as it keeps a
	// response that a first request is re-writing at the same moment.
	if n, err := h.Cleanup(context.Background(), 0); err != nil || n != 0 {
		t.Errorf("Cleanup of a young orphan: %d, %v; want 0", n, err)
	}
	second := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
	third := mustPost(t, s.Client(), s.URL, "k", "o", `{}`)
	if second.replayed || second.body == first.body || !third.replayed || third.body != second.body {
		t.Errorf("orphan: second replayed=%v, third replayed=%v same=%v", second.replayed, third.replayed, third.body == second.body)
	}
}
