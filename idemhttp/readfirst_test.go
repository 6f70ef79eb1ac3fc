package idemhttp_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
)

// TestReadFirst: a request whose stored response is read before any claim
// (as while replays are frequent) is answered with that response, byte for
// byte, without a claim, only when its claim exists: another scope's
// response, a response left behind by a claim cleaned up, another
// request's response and a response not committed yet are never what it
// gets.
func TestReadFirst(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		counts := &idempotent.Counts{}
		b.observer = counts
		entered, release := make(chan struct{}), make(chan struct{})
		a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
			if r.Header.Get("X-Order") == "o-slow" && b.busy {
				close(entered)
				<-release
			}
			return false
		}}
		scope := func(r *http.Request) (string, error) {
			if c := r.Header.Get("X-Client"); c != "" {
				return c, nil
			}
			return "", errors.New("no client")
		}
		_, h := b.middleware(t, scope)
		idemhttp.AlwaysReadFirst(h)
		s := server(t, h.Wrap(a))
		c := s.Client()

		first := mustPost(t, c, s.URL, "k1", "o1", `{"n":1}`, "X-Client", "alice")
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("first request: %d replayed=%v %s", first.status, first.replayed, first.body)
		}
		claims := counts.Applied() + counts.Duplicates()
		again := mustPost(t, c, s.URL, "k1", "o1", `{"n":1}`, "X-Client", "alice")
		if !again.replayed || again.status != first.status || again.body != first.body {
			t.Errorf("replay: %d replayed=%v %q, want the stored %d %q", again.status, again.replayed, again.body, first.status, first.body)
		}
		for _, f := range []string{"Content-Type", "Location"} {
			if again.header.Get(f) != first.header.Get(f) {
				t.Errorf("replay's %s %q, want %q", f, again.header.Get(f), first.header.Get(f))
			}
		}
		if again.header.Get("Set-Cookie") != "" {
			t.Errorf("replay with Set-Cookie %q", again.header.Get("Set-Cookie"))
		}
		if n := counts.Applied() + counts.Duplicates(); n != claims {
			t.Errorf("the replay claimed (%d claims, want %d): it was not read first", n, claims)
		}
		if r := mustPost(t, c, s.URL, "k1", "o1", `{"n":2}`, "X-Client", "alice"); r.status != http.StatusUnprocessableEntity {
			t.Errorf("the key with another body: %d %s, want 422", r.status, r.body)
		}
		bob := mustPost(t, c, s.URL, "k1", "o1", `{"n":1}`, "X-Client", "bob")
		if bob.replayed || bob.status != http.StatusCreated || bob.body == first.body {
			t.Errorf("bob with alice's key: %d replayed=%v, want his own 201", bob.status, bob.replayed)
		}
		if n := b.count(t, "o1"); n != 2 {
			t.Errorf("%d effects of o1, want 2 (alice's and bob's)", n)
		}

		// The claims are cleaned up and the responses left behind: the key
		// is free again, and its retry runs the handler.
		exec(t, b.db, "DELETE FROM "+b.claims)
		rerun := mustPost(t, c, s.URL, "k1", "o1", `{"n":1}`, "X-Client", "alice")
		if rerun.replayed || rerun.status != http.StatusCreated || rerun.body == first.body {
			t.Errorf("after the claim's cleanup: %d replayed=%v %q, want the handler to run again", rerun.status, rerun.replayed, rerun.body)
		}
		if r := mustPost(t, c, s.URL, "k1", "o1", `{"n":1}`, "X-Client", "alice"); !r.replayed || r.body != rerun.body {
			t.Errorf("retry of the re-run: replayed=%v %q, want %q", r.replayed, r.body, rerun.body)
		}
		if n := b.count(t, "o1"); n != 3 {
			t.Errorf("%d effects of o1, want 3", n)
		}

		if !b.busy {
			return // SQLite: a retry waits for the first request
		}
		// A retry while the first request is in flight gets a 409, not a
		// response that has not committed.
		done := make(chan response, 1)
		go func() {
			r, err := post(t, c, s.URL, "k2", "o-slow", `{}`, "X-Client", "alice")
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		<-entered
		busy := mustPost(t, c, s.URL, "k2", "o-slow", `{}`, "X-Client", "alice")
		close(release)
		slow := <-done
		if busy.status != http.StatusConflict {
			t.Errorf("retry while in flight: %d replayed=%v %q, want 409", busy.status, busy.replayed, busy.body)
		}
		if r := mustPost(t, c, s.URL, "k2", "o-slow", `{}`, "X-Client", "alice"); !r.replayed || r.body != slow.body || slow.status != http.StatusCreated {
			t.Errorf("retry after it: replayed=%v %q, want %q", r.replayed, r.body, slow.body)
		}
		if n := b.count(t, "o-slow"); n != 1 {
			t.Errorf("%d effects of the slow request, want 1", n)
		}
	})
}

// TestReadFirstWhileReplaysFrequent: a request reads its stored response
// before claiming only while replays have outweighed first requests (two
// each against one): a replay after first requests only claims, one after
// another replay is read first, and enough first requests turn it off.
func TestReadFirstWhileReplaysFrequent(t *testing.T) {
	b := openBackend(t, "postgres")
	counts := &idempotent.Counts{}
	b.observer = counts
	_, h := b.middleware(t, idemhttp.GlobalScope)
	s := server(t, h.Wrap(&app{b: b}))
	c := s.Client()
	replay := func(want bool, when string) {
		t.Helper()
		dups := counts.Duplicates()
		if r := mustPost(t, c, s.URL, "k", "o", `{}`); !r.replayed {
			t.Fatalf("%s: %d, not replayed", when, r.status)
		}
		if claimed := counts.Duplicates() != dups; claimed == want {
			t.Errorf("%s: claimed %v, want read first %v", when, claimed, want)
		}
	}
	mustPost(t, c, s.URL, "k", "o", `{}`)
	replay(false, "the first replay")
	replay(true, "a replay after a replay")
	replay(true, "a third replay")
	// The score is 6 (2 a replay read first or not, less 1 for the first
	// request, never below 0): six first requests bring it back to 0.
	for i := range 6 {
		mustPost(t, c, s.URL, "n"+strconv.Itoa(i), "o", `{}`)
	}
	replay(false, "a replay after six first requests")
}
