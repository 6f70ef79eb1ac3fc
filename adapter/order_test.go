package adapter_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

func TestParseOrder(t *testing.T) {
	for _, c := range []struct {
		key, seq string
		wantKey  string
		wantSeq  int64
		err      string
	}{
		{"", "", "", 0, ""},
		{"acct:1", "7", "acct:1", 7, ""},
		{"acct:1", " 12 ", "acct:1", 12, ""},
		{"acct:1", "", "", 0, "Idempotent-Order-Seq is missing"},
		{"", "3", "", 0, "Idempotent-Order-Key is missing"},
		{"acct:1", "seven", "", 0, `Idempotent-Order-Seq "seven" is not a decimal integer`},
		{"acct:1", "0", "", 0, `"0" is below 1`},
		{"acct:1", "-2", "", 0, `"-2" is below 1`},
		{"acct:1", "99999999999999999999", "", 0, "not a decimal integer"},
	} {
		key, seq, err := adapter.ParseOrder(c.key, c.seq)
		if c.err == "" {
			if err != nil || key != c.wantKey || seq != c.wantSeq {
				t.Errorf("ParseOrder(%q, %q) = %q, %d, %v; want %q, %d", c.key, c.seq, key, seq, err, c.wantKey, c.wantSeq)
			}
			continue
		}
		if !errors.Is(err, idempotent.ErrInvalidOrder) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseOrder(%q, %q): %v; want ErrInvalidOrder saying %q", c.key, c.seq, err, c.err)
		}
	}
}

// TestRoute: every delivery of one key reaches one worker, in the order
// it was sent, and every delivery arrives once.
func TestRoute(t *testing.T) {
	type d struct {
		key string
		n   int
	}
	in := make(chan d)
	outs := adapter.Route(in, 4, 2, func(x d) string { return x.key })
	var mu sync.Mutex
	seen := map[string][]int{}
	worker := map[string]int{}
	var wg sync.WaitGroup
	for w, ch := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for x := range ch {
				mu.Lock()
				if prev, ok := worker[x.key]; ok && prev != w {
					t.Errorf("key %s on workers %d and %d", x.key, prev, w)
				}
				worker[x.key] = w
				seen[x.key] = append(seen[x.key], x.n)
				mu.Unlock()
			}
		}()
	}
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for n := range 50 {
		for _, k := range keys {
			in <- d{k, n}
		}
	}
	close(in)
	wg.Wait()
	used := map[int]bool{}
	for _, k := range keys {
		used[worker[k]] = true
		if len(seen[k]) != 50 {
			t.Fatalf("key %s: %d deliveries, want 50", k, len(seen[k]))
		}
		for i, n := range seen[k] {
			if n != i {
				t.Fatalf("key %s: deliveries in the order %v", k, seen[k])
			}
		}
	}
	if len(used) < 2 {
		t.Errorf("8 keys all went to one worker")
	}
}
