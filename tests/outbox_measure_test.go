package tests

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent/outbox"
)

var measureOutbox = flag.Bool("outbox.measure", false, "run TestOutboxMeasure: relay throughput and commit-to-call delay")

// TestOutboxMeasure measures the relay against a local no-op provider: its
// throughput in calls per second, and the delay from the enqueueing commit
// to the provider's call, woken by NOTIFY and by polling only. It prints
// Markdown tables. It is slow, so it runs only with -outbox.measure:
//
//	go test -count=1 -run TestOutboxMeasure -v ./tests/ -args -outbox.measure
func TestOutboxMeasure(t *testing.T) {
	if !*measureOutbox {
		t.Skip("measurement: run with -args -outbox.measure")
	}
	// The no-op provider records when each key first arrives.
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		if _, ok := arrived[key]; !ok {
			arrived[key] = now
		}
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	client := newHTTPClient(t)
	sender := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
	reset := func() {
		mu.Lock()
		clear(arrived)
		mu.Unlock()
	}

	t.Run("throughput", func(t *testing.T) {
		const (
			rows   = 10000
			rounds = 3
		)
		type config struct {
			relays, concurrency, batch int
			async, fresh               bool
		}
		configs := []config{
			{1, 16, 16, false, false},
			{1, 64, 64, false, false},
			{4, 16, 16, false, false},
			{1, 16, 16, true, false},
			{1, 64, 64, true, false},
			{4, 16, 16, true, false},
			{1, 64, 64, false, true},
		}
		// measure relays rows rows to the provider in a subtest of its own,
		// whose cleanup closes its connections, and returns calls/s.
		measure := func(t *testing.T, name string, tc config) (perSecond float64) {
			t.Run(name, func(t *testing.T) {
				db := openDB(t)
				if tc.async {
					db = openAsyncDB(t)
				}
				db.SetMaxOpenConns(8)
				ob, _ := newOutbox(t, db, "bench")
				if _, err := db.Exec(`INSERT INTO `+ob.Table()+` (consumer, message_key, kind, idempotency_key, payload)
					SELECT 'bench', 'm-' || g, 'noop', md5(g::text), '{"n": 1}' FROM generate_series(1, $1) g`, rows); err != nil {
					t.Fatal(err)
				}
				if !tc.fresh {
					// What autovacuum does for a table that filled up.
					if _, err := db.Exec(`ANALYZE ` + ob.Table()); err != nil {
						t.Fatal(err)
					}
				}
				reset()
				start := time.Now()
				var stops []func()
				for range tc.relays {
					r, err := outbox.NewRelay(ob, outbox.WithSender("noop", sender), outbox.WithPollInterval(50*time.Millisecond),
						outbox.WithConcurrency(tc.concurrency), outbox.WithBatch(tc.batch))
					if err != nil {
						t.Fatal(err)
					}
					stops = append(stops, runRelay(t, r))
				}
				waitUntil(t, 5*time.Minute, "every row to be sent", func() bool {
					st, err := ob.Stats(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					return st.Pending == 0
				})
				perSecond = rows / time.Since(start).Seconds()
				for _, stop := range stops {
					stop()
				}
			})
			return perSecond
		}
		// Rounds interleave the configurations, so that a busy moment on
		// the machine hits them all alike; the table shows the median.
		results := make([][]float64, len(configs))
		for round := range rounds {
			for i, tc := range configs {
				results[i] = append(results[i], measure(t, fmt.Sprintf("round%d/config%d", round, i), tc))
			}
		}
		fmt.Printf("\n| relays × concurrency (batch) | relay sessions | table | calls/s, median of %d (min–max) |\n|---|---|---|---|\n", rounds)
		for i, tc := range configs {
			mode, table := "synchronous_commit on", "analyzed"
			if tc.async {
				mode = "synchronous_commit off"
			}
			if tc.fresh {
				table = "never analyzed"
			}
			r := slices.Clone(results[i])
			slices.Sort(r)
			fmt.Printf("| %d × %d (%d) | %s | %s | %.0f (%.0f–%.0f) |\n", tc.relays, tc.concurrency, tc.batch, mode, table, r[len(r)/2], r[0], r[len(r)-1])
		}
	})

	t.Run("delay", func(t *testing.T) {
		const (
			messages = 400
			rate     = 100 // commits per second
		)
		fmt.Printf("\n| wake-up | p50 | p99 | max |\n|---|---|---|---|\n")
		for _, tc := range []struct {
			name   string
			listen bool
			poll   time.Duration
		}{
			{"NOTIFY (poll 1s as fallback)", true, time.Second},
			{"polling every 1s (default)", false, time.Second},
			{"polling every 100ms", false, 100 * time.Millisecond},
		} {
			db := openDB(t)
			db.SetMaxOpenConns(8)
			ob, _ := newOutbox(t, db, "bench")
			opts := []outbox.RelayOption{outbox.WithSender("noop", sender), outbox.WithPollInterval(tc.poll)}
			if tc.listen {
				opts = append(opts, outbox.WithListener(pgDSN))
			}
			var listening sync.WaitGroup
			listening.Add(1)
			var once sync.Once
			ob2, err := outbox.New(db, "bench", outbox.WithTable(ob.Table()), outbox.WithObserver(outbox.ObserverFunc(func(_ context.Context, e outbox.Event) {
				if e.Type == outbox.EventListening {
					once.Do(listening.Done)
				}
			})))
			if err != nil {
				t.Fatal(err)
			}
			r, err := outbox.NewRelay(ob2, opts...)
			if err != nil {
				t.Fatal(err)
			}
			reset()
			stop := runRelay(t, r)
			if tc.listen {
				listening.Wait()
			}
			committed := map[string]time.Time{}
			tick := time.NewTicker(time.Second / rate)
			for i := range messages {
				<-tick.C
				tx, err := db.Begin()
				if err != nil {
					t.Fatal(err)
				}
				key, err := ob.Enqueue(context.Background(), tx, fmt.Sprintf("m-%d", i), "noop", []byte(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				committed[key] = time.Now()
			}
			tick.Stop()
			waitUntil(t, time.Minute, "every row to be sent", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(arrived) >= messages
			})
			stop()
			var delays []time.Duration
			mu.Lock()
			for key, at := range committed {
				delays = append(delays, arrived[key].Sub(at))
			}
			mu.Unlock()
			slices.Sort(delays)
			pct := func(p float64) time.Duration { return delays[int(p*float64(len(delays)-1))] }
			fmt.Printf("| %s | %v | %v | %v |\n", tc.name, pct(0.50).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), delays[len(delays)-1].Round(100*time.Microsecond))
		}
	})
}
