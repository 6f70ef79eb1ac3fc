package adapter_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/postgres"
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

// TestMessageReadsOrderOnlyWithOrdering: a delivery's ordering headers
// become the message's OrderKey and OrderSeq (with its payload kept for
// parking) when the Middleware was created WithOrdering; a Middleware
// without it ignores them, so a producer that orders its messages for one
// consumer does not make them poison for another — and a bad ordering
// header is poison only where it is read.
func TestMessageReadsOrderOnlyWithOrdering(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	type delivery struct {
		key  string
		hdr  map[string]string
		body []byte
	}
	tr := adapter.Transport[delivery]{
		Name:       "t",
		DefaultKey: func(d delivery) (string, error) { return d.key, nil },
		Header:     func(d delivery, name string) (string, bool) { v, ok := d.hdr[name]; return v, ok },
		Payload:    func(d delivery) []byte { return d.body },
	}
	ordered := delivery{key: "m-1", body: []byte("credit"), hdr: map[string]string{adapter.OrderKeyHeader: "acct-1", adapter.OrderSeqHeader: "3"}}
	bad := delivery{key: "m-2", hdr: map[string]string{adapter.OrderKeyHeader: "acct-1", adapter.OrderSeqHeader: "three"}}
	for _, c := range []struct {
		name string
		opts []idempotent.Option
		want idempotent.Message
		bad  bool // the bad header is poison
	}{
		{"WithOrdering", []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }})},
			idempotent.Message{Key: "m-1", OrderKey: "acct-1", OrderSeq: 3, Payload: []byte("credit")}, true},
		{"without", nil, idempotent.Message{Key: "m-1"}, false},
	} {
		mw, err := idempotent.New(db, postgres.New(), "c", c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		cfg := adapter.NewConfig(tr)
		if err := cfg.Check(mw); err != nil {
			t.Fatal(err)
		}
		m, err := cfg.Message(ordered)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if m.Key != c.want.Key || m.OrderKey != c.want.OrderKey || m.OrderSeq != c.want.OrderSeq || string(m.Payload) != string(c.want.Payload) {
			t.Errorf("%s: Message = key %q order %q/%d payload %q, want key %q order %q/%d payload %q", c.name,
				m.Key, m.OrderKey, m.OrderSeq, m.Payload, c.want.Key, c.want.OrderKey, c.want.OrderSeq, c.want.Payload)
		}
		if _, err := cfg.Message(bad); errors.Is(err, idempotent.ErrInvalidOrder) != c.bad {
			t.Errorf("%s: a bad sequence header: %v, want ErrInvalidOrder %v", c.name, err, c.bad)
		}
	}
}

// TestCheckRefusesOrderingWithoutPayload: a transport whose deliveries'
// bodies the adapter cannot read cannot park them, so a Middleware created
// WithOrdering is refused at construction rather than releasing a parked
// message without its body.
func TestCheckRefusesOrderingWithoutPayload(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, postgres.New(), "c", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }}))
	if err != nil {
		t.Fatal(err)
	}
	tr := adapter.Transport[string]{Name: "t", DefaultKey: func(s string) (string, error) { return s, nil },
		Header: func(string, string) (string, bool) { return "", false }}
	without := adapter.NewConfig(tr)
	if err := without.Check(mw); err == nil || !strings.Contains(err.Error(), "WithOrdering") {
		t.Errorf("Check without a Payload: %v, want a refusal naming WithOrdering", err)
	}
	tr.Payload = func(s string) []byte { return []byte(s) }
	with := adapter.NewConfig(tr)
	if err := with.Check(mw); err != nil {
		t.Errorf("Check with a Payload: %v", err)
	}
}
