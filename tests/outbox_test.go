package tests

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// openAsyncDB is openDB with synchronous_commit off in every session: commits
// return without waiting for the WAL to reach the disk. Tests that check the
// logic of many short transactions, not durability across a server crash,
// use it so that they do not wait on the shared server's disk.
func openAsyncDB(t testing.TB) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	cfg, err := pq.NewConfig(pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runtime == nil {
		cfg.Runtime = map[string]string{}
	}
	cfg.Runtime["synchronous_commit"] = "off"
	c, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// newOutbox returns an Outbox for consumer on a table of a schema of the
// test's own, created with EnsureSchema.
func newOutbox(t testing.TB, db *sql.DB, consumer string, opts ...outbox.Option) (*outbox.Outbox, string) {
	t.Helper()
	schema := tempSchema(t, db)
	opts = append([]outbox.Option{outbox.WithTable(schema + ".outbox")}, opts...)
	ob, err := outbox.New(db, consumer, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ob, schema
}

// enqueue commits one call in a transaction of its own.
func enqueue(t testing.TB, db *sql.DB, ob *outbox.Outbox, msgKey, kind string, payload string, opts ...outbox.EnqueueOption) string {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	key, err := ob.Enqueue(context.Background(), tx, msgKey, kind, []byte(payload), opts...)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return key
}

// outboxRow is a row of the outbox table as the tests inspect it.
type outboxRow struct {
	key, msgKey, state, owner, lastError string
	attempts                             int
	leaseLive                            bool
}

func outboxRows(t testing.TB, db *sql.DB, ob *outbox.Outbox) map[string]outboxRow {
	t.Helper()
	rows, err := db.Query(`SELECT idempotency_key, message_key, state, COALESCE(lease_owner, ''), COALESCE(last_error, ''),
		attempts, COALESCE(lease_expires_at > now(), false) FROM ` + ob.Table())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]outboxRow{}
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.key, &r.msgKey, &r.state, &r.owner, &r.lastError, &r.attempts, &r.leaseLive); err != nil {
			t.Fatal(err)
		}
		out[r.key] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// provider stands in for an external API that honours idempotency keys: it
// performs each key once and answers repeats with the first result. It
// records every call, detects calls for one key that overlap in time, and
// can fail a share of calls, before or after performing them.
type provider struct {
	srv *httptest.Server

	failBefore, failAfter float64       // shares of calls failed before / after performing
	delay                 time.Duration // upper bound of a random delay per call
	mu                    sync.Mutex
	calls                 map[string]int    // calls received, by key
	bodies                map[string]string // first body, by key
	performed             map[string]int    // performances, by key
	byMsg                 map[string]int    // performances, by the payload's "msg"
	inflight              map[string]int
	overlaps              []string
	conflicts             []string // same key, different body
	arrived               map[string]time.Time
}

func newProvider(t testing.TB, failBefore, failAfter float64, delay time.Duration) *provider {
	t.Helper()
	p := &provider{
		failBefore: failBefore, failAfter: failAfter, delay: delay,
		calls: map[string]int{}, bodies: map[string]string{}, performed: map[string]int{},
		byMsg: map[string]int{}, inflight: map[string]int{}, arrived: map[string]time.Time{},
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if key == "" || err != nil {
		http.Error(w, "no key", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.calls[key]++
	if _, ok := p.arrived[key]; !ok {
		p.arrived[key] = now
	}
	if p.inflight[key] > 0 {
		p.overlaps = append(p.overlaps, key)
	}
	p.inflight[key]++
	if first, ok := p.bodies[key]; !ok {
		p.bodies[key] = string(body)
	} else if first != string(body) {
		p.conflicts = append(p.conflicts, key)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight[key]--
		p.mu.Unlock()
	}()

	if p.delay > 0 {
		time.Sleep(rand.N(p.delay))
	}
	roll := rand.Float64()
	if roll < p.failBefore {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	p.mu.Lock()
	if p.performed[key] == 0 {
		var m struct{ Msg string }
		_ = json.Unmarshal(body, &m)
		p.byMsg[m.Msg]++
	}
	p.performed[key] = 1
	p.mu.Unlock()
	if roll < p.failBefore+p.failAfter {
		// Performed, but the answer is lost.
		http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (p *provider) snapshot() (calls, performed, byMsg map[string]int, overlaps, conflicts []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cp := func(m map[string]int) map[string]int {
		out := make(map[string]int, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return cp(p.calls), cp(p.performed), cp(p.byMsg), append([]string(nil), p.overlaps...), append([]string(nil), p.conflicts...)
}

// sender posts a row's payload to the provider with its idempotency key.
func (p *provider) sender(client *http.Client) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL, bytes.NewReader(m.Payload))
		if err != nil {
			return outbox.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return nil
		case resp.StatusCode == http.StatusBadRequest:
			return outbox.Permanent(fmt.Errorf("provider: %s", resp.Status))
		}
		return fmt.Errorf("provider: %s", resp.Status)
	})
}

func newHTTPClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// runRelay runs r until the returned stop function is called; stop cancels
// Run's context and waits for it to return, failing the test on an error.
func runRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay %s: Run: %v", r.ID(), err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitUntil polls cond every 20ms until it holds, failing the test after
// within.
func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eventLog is an observer that keeps every event.
type eventLog struct {
	outbox.Counts
	mu     sync.Mutex
	events []outbox.Event
	notify chan outbox.Event
}

func newEventLog() *eventLog { return &eventLog{notify: make(chan outbox.Event, 1024)} }

func (l *eventLog) Observe(ctx context.Context, e outbox.Event) {
	l.Counts.Observe(ctx, e)
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	select {
	case l.notify <- e:
	default:
	}
}

func (l *eventLog) of(t outbox.EventType) []outbox.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []outbox.Event
	for _, e := range l.events {
		if e.Type == t {
			out = append(out, e)
		}
	}
	return out
}

// TestOutboxChaos runs the whole path under failure: 2,000 messages, some
// delivered twice, some whose handler fails once and some that always fail,
// each enqueueing one call through idempotent.Process; relays killed at
// random moments, mid-call, and replaced; a provider failing 20% of calls.
// Every committed call must reach the provider and be performed exactly
// once; no call of a rolled-back handler may reach it; no two relays may
// hold one row at once.
func TestOutboxChaos(t *testing.T) {
	t.Parallel()
	const (
		messages = 2000
		consumer = "shop"
		kind     = "charge"
	)
	db := openAsyncDB(t)
	db.SetMaxOpenConns(12)
	relayDB := openAsyncDB(t)
	relayDB.SetMaxOpenConns(10)

	log := newEventLog()
	ob, schema := newOutbox(t, db, consumer, outbox.WithObserver(log))
	relayOB, err := outbox.New(relayDB, consumer, outbox.WithTable(ob.Table()), outbox.WithObserver(log))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), consumer, idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}

	prov := newProvider(t, 0.10, 0.10, 3*time.Millisecond)
	client := newHTTPClient(t)
	var aborted atomic.Int64 // calls cut off by a killed relay
	send := prov.sender(client)

	// Relays, killed and replaced at random while messages arrive. Each has
	// its own sender so that the chaos can also kill one at a known moment:
	// armed, the relay's next call that reaches the provider is held there
	// until its relay is killed, so at least one call is certainly cut off
	// after the provider performed it, before the relay recorded it.
	type relay struct {
		stop func()
		hold atomic.Bool   // hold the next performed call until killed
		held chan struct{} // closed when a call is being held
	}
	var relaySeq atomic.Int64
	startRelay := func(grace bool) *relay {
		rl := &relay{held: make(chan struct{})}
		sender := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
			err := send.Send(ctx, m)
			if err == nil && rl.hold.CompareAndSwap(true, false) {
				close(rl.held)
				<-ctx.Done()
				err = ctx.Err()
			}
			if err != nil && ctx.Err() != nil {
				aborted.Add(1)
			}
			return err
		})
		opts := []outbox.RelayOption{
			outbox.WithSender(kind, sender),
			outbox.WithRelayID(fmt.Sprintf("relay-%d", relaySeq.Add(1))),
			outbox.WithListener(pgDSN),
			outbox.WithPollInterval(100 * time.Millisecond),
			outbox.WithLease(time.Second),
			outbox.WithCallTimeout(500 * time.Millisecond),
			outbox.WithConcurrency(8), outbox.WithBatch(8),
			outbox.WithMaxAttempts(30),
			outbox.WithBackoff(outbox.Backoff{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond}),
		}
		if !grace {
			opts = append(opts, outbox.WithShutdownGrace(0))
		}
		r, err := outbox.NewRelay(relayOB, opts...)
		if err != nil {
			t.Fatal(err)
		}
		rl.stop = runRelay(t, r)
		return rl
	}
	var relaysMu sync.Mutex
	relays := []*relay{startRelay(false), startRelay(false), startRelay(true)}
	chaosDone := make(chan struct{})
	var chaos sync.WaitGroup
	var kills, heldKills atomic.Int64
	chaos.Add(1)
	go func() {
		defer chaos.Done()
		for n := 0; ; n++ {
			select {
			case <-chaosDone:
				return
			case <-time.After(time.Duration(20+rand.IntN(150)) * time.Millisecond):
			}
			relaysMu.Lock()
			i := rand.IntN(len(relays))
			if n%4 == 0 {
				// Every fourth kill waits for a call of relay 0 (never
				// graceful) to be held at the provider, and kills it then.
				i = 0
				relays[0].hold.Store(true)
				select {
				case <-relays[0].held:
					heldKills.Add(1)
				case <-chaosDone:
				}
			}
			relays[i].stop() // killed mid-call (grace 0) or stopped gracefully
			relays[i] = startRelay(i != 0 && rand.IntN(3) == 0)
			relaysMu.Unlock()
			kills.Add(1)
		}
	}()

	// Deliveries: every message once; every fifth once more, maybe concurrently;
	// every seventh fails on its first run; every fortieth always fails.
	type delivery struct {
		msg  int
		fail bool
	}
	var deliveries []delivery
	poison := map[int]bool{}
	for i := range messages {
		switch {
		case i%40 == 0:
			poison[i] = true
			deliveries = append(deliveries, delivery{i, true}, delivery{i, true})
		case i%7 == 0:
			deliveries = append(deliveries, delivery{i, true}, delivery{i, false})
		default:
			deliveries = append(deliveries, delivery{i, false})
		}
		if i%5 == 0 && !poison[i] {
			deliveries = append(deliveries, delivery{i, false})
		}
	}
	rand.Shuffle(len(deliveries), func(a, b int) { deliveries[a], deliveries[b] = deliveries[b], deliveries[a] })
	errFlaky := errors.New("handler failed after enqueueing")
	msgKey := func(i int) string { return fmt.Sprintf("order-%d", i) }
	work := make(chan delivery)
	var workers sync.WaitGroup
	var applied, duplicates atomic.Int64
	for range 12 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for d := range work {
				payload := fmt.Sprintf(`{"msg": %q, "amount_cents": %d}`, msgKey(d.msg), 100+d.msg)
				out, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: msgKey(d.msg)}, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := ob.Enqueue(ctx, tx, msgKey(d.msg), kind, []byte(payload)); err != nil {
						return err
					}
					if d.fail {
						return errFlaky
					}
					return nil
				})
				switch {
				case errors.Is(err, errFlaky):
				case err != nil:
					t.Errorf("message %d: %v", d.msg, err)
				case out == idempotent.Applied:
					applied.Add(1)
				default:
					duplicates.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	for _, d := range deliveries {
		work <- d
	}
	close(work)
	workers.Wait()
	t.Logf("%d deliveries handled in %v", len(deliveries), time.Since(start))
	committed := messages - len(poison)
	if applied.Load() != int64(committed) {
		t.Errorf("%d messages applied, want %d", applied.Load(), committed)
	}

	// Let the chaos go on while the relays catch up, then stop it and wait
	// for the last rows, leases expired included.
	waitUntil(t, time.Minute, "a third of the calls to be sent", func() bool { return log.Count(outbox.EventSent) >= int64(committed/3) })
	close(chaosDone)
	chaos.Wait()
	waitUntil(t, time.Minute, "every row to be sent", func() bool {
		st, err := ob.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Pending == 0
	})
	t.Logf("all rows sent %v after the first delivery", time.Since(start))
	relaysMu.Lock()
	for _, rl := range relays {
		rl.stop()
	}
	relaysMu.Unlock()

	calls, performed, byMsg, overlaps, conflicts := prov.snapshot()
	rows := outboxRows(t, db, ob)
	if len(rows) != committed {
		t.Errorf("%d outbox rows, want %d (one per committed message)", len(rows), committed)
	}
	for i := range messages {
		key := outbox.Key(consumer, msgKey(i), kind)
		if poison[i] {
			if calls[key] != 0 {
				t.Errorf("message %d: its handler always rolled back, but the provider got %d calls", i, calls[key])
			}
			if _, ok := rows[key]; ok {
				t.Errorf("message %d: its handler always rolled back, but it has an outbox row", i)
			}
			continue
		}
		if calls[key] < 1 || performed[key] != 1 || byMsg[msgKey(i)] != 1 {
			t.Errorf("message %d: %d calls, performed %d times by key and %d by message; want ≥1, 1, 1", i, calls[key], performed[key], byMsg[msgKey(i)])
		}
		if r := rows[key]; r.state != "sent" {
			t.Errorf("message %d: row is %q after %d attempts (%s), want sent", i, r.state, r.attempts, r.lastError)
		}
	}
	if len(calls) != committed {
		t.Errorf("the provider saw %d keys, want %d", len(calls), committed)
	}
	if len(overlaps) > 0 {
		t.Errorf("%d calls overlapped another in-flight call of the same key, e.g. %s", len(overlaps), overlaps[0])
	}
	if len(conflicts) > 0 {
		t.Errorf("%d calls reused a key with another body, e.g. %s", len(conflicts), conflicts[0])
	}
	// A relay killed while marking rows sent may have marked them without
	// seeing it, so sent events can be fewer than rows — never more.
	if n := log.Count(outbox.EventSent); n > int64(committed) || n == 0 {
		t.Errorf("%d sent events, want 1 to %d", n, committed)
	}
	if n := log.Count(outbox.EventDead); n != 0 {
		t.Errorf("%d dead rows, want none", n)
	}
	total := 0
	for _, n := range calls {
		total += n
	}
	t.Logf("%d committed messages (%d applied, %d duplicates), %d calls, %d failed attempts, %d calls cut off by %d relay kills (%d of them while a performed call was held), %d leases lost",
		committed, applied.Load(), duplicates.Load(), total, log.Count(outbox.EventFailed), aborted.Load(), kills.Load(), heldKills.Load(), log.Count(outbox.EventLeaseLost))
	// The test must have exercised what it claims to.
	if log.Count(outbox.EventFailed) == 0 || aborted.Load() == 0 || heldKills.Load() == 0 || duplicates.Load() == 0 {
		t.Errorf("no failed attempts (%d), cut-off calls (%d), kills of a held call (%d) or duplicates (%d): the chaos did not happen",
			log.Count(outbox.EventFailed), aborted.Load(), heldKills.Load(), duplicates.Load())
	}
}

// TestOutboxNoDoubleLease runs four relays on one table with calls slow
// enough to overlap, and no failures: every key must be called exactly
// once, and never while another call of it is in flight.
func TestOutboxNoDoubleLease(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(8)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "mailer", outbox.WithObserver(log))
	const n = 200
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := ob.Enqueue(context.Background(), tx, fmt.Sprintf("m-%d", i), "email", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	prov := newProvider(t, 0, 0, 10*time.Millisecond)
	client := newHTTPClient(t)
	var stops []func()
	for i := range 4 {
		r, err := outbox.NewRelay(ob, outbox.WithSender("email", prov.sender(client)),
			outbox.WithRelayID(fmt.Sprintf("r%d", i)), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithConcurrency(4), outbox.WithBatch(2), outbox.WithLease(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, runRelay(t, r))
	}
	waitUntil(t, time.Minute, "every row to be sent", func() bool {
		st, err := ob.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Pending == 0
	})
	for _, stop := range stops {
		stop()
	}
	calls, _, _, overlaps, _ := prov.snapshot()
	if len(calls) != n {
		t.Errorf("provider saw %d keys, want %d", len(calls), n)
	}
	for key, c := range calls {
		if c != 1 {
			t.Errorf("key %s called %d times, want once", key, c)
		}
	}
	if len(overlaps) > 0 {
		t.Errorf("%d overlapping calls for one key, e.g. %s", len(overlaps), overlaps[0])
	}
	for _, r := range outboxRows(t, db, ob) {
		if r.attempts != 1 || r.state != "sent" {
			t.Errorf("row %s: %s after %d attempts, want sent after 1", r.key, r.state, r.attempts)
		}
	}
	// The test means something only if the relays shared the work.
	byRelay := map[string]int{}
	for _, e := range log.of(outbox.EventSent) {
		byRelay[e.Relay]++
	}
	if len(byRelay) < 2 {
		t.Errorf("rows sent by relays %v: want the work shared", byRelay)
	}
}

// TestOutboxDeadAfterMaxAttempts checks that a call failing every time is
// tried the maximum number of times, then marked dead and reported, and
// that a Permanent error kills the row at once.
func TestOutboxDeadAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		failWith  error
		wantCalls int
	}{
		{"transient", errors.New("provider down"), 3},
		{"permanent", outbox.Permanent(errors.New("card declined")), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			db.SetMaxOpenConns(4)
			log := newEventLog()
			ob, _ := newOutbox(t, db, "billing", outbox.WithObserver(log))
			key := enqueue(t, db, ob, "invoice-1", "charge", `{"cents": 100}`)
			var calls atomic.Int64
			r, err := outbox.NewRelay(ob, outbox.WithSender("charge", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
				calls.Add(1)
				return tc.failWith
			})), outbox.WithMaxAttempts(3), outbox.WithPollInterval(10*time.Millisecond),
				outbox.WithBackoff(outbox.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, r)
			waitUntil(t, time.Minute, "a dead event", func() bool { return log.Count(outbox.EventDead) > 0 })
			// Give the relay many polls in which it must not try again.
			time.Sleep(100 * time.Millisecond)
			stop()
			if got := calls.Load(); got != int64(tc.wantCalls) {
				t.Errorf("%d calls, want %d", got, tc.wantCalls)
			}
			dead := log.of(outbox.EventDead)
			if len(dead) != 1 || dead[0].IdempotencyKey != key || dead[0].Attempt != tc.wantCalls || !errors.Is(dead[0].Err, tc.failWith) {
				t.Errorf("dead events %+v, want one for %s at attempt %d with %v", dead, key, tc.wantCalls, tc.failWith)
			}
			if n := log.Count(outbox.EventFailed); n != int64(tc.wantCalls-1) {
				t.Errorf("%d failed events, want %d", n, tc.wantCalls-1)
			}
			row := outboxRows(t, db, ob)[key]
			if row.state != "dead" || row.attempts != tc.wantCalls || !strings.Contains(row.lastError, tc.failWith.Error()) || row.owner != "" {
				t.Errorf("row %+v, want dead after %d attempts with error %q and no lease", row, tc.wantCalls, tc.failWith)
			}
			st, err := ob.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.Dead != 1 || st.Pending != 0 {
				t.Errorf("stats %+v, want 1 dead and none pending", st)
			}
		})
	}
}

// TestOutboxAbandonedLease kills a relay in the middle of a call: its lease
// stays until it expires, then another relay calls again with the same
// idempotency key — or, if that was the last allowed attempt, marks the row
// dead without calling.
func TestOutboxAbandonedLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		maxAttempts int
		wantState   string
	}{
		{"retried", 5, "sent"},
		{"last attempt", 1, "dead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			db.SetMaxOpenConns(4)
			log := newEventLog()
			ob, _ := newOutbox(t, db, "receipts", outbox.WithObserver(log))
			key := enqueue(t, db, ob, "order-7", "send_receipt", `{"to": "a@example.com"}`)
			lease := 300 * time.Millisecond

			started := make(chan outbox.Message, 1)
			hang := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
				started <- m
				<-ctx.Done()
				return ctx.Err()
			})
			a, err := outbox.NewRelay(ob, outbox.WithSender("send_receipt", hang), outbox.WithRelayID("relay-a"),
				outbox.WithLease(lease), outbox.WithCallTimeout(lease-50*time.Millisecond), outbox.WithShutdownGrace(0),
				outbox.WithMaxAttempts(tc.maxAttempts))
			if err != nil {
				t.Fatal(err)
			}
			killA := runRelay(t, a)
			first := <-started
			killA()
			row := outboxRows(t, db, ob)[key]
			if row.owner != "relay-a" || row.state != "pending" || row.attempts != 1 {
				t.Fatalf("after the kill the row is %+v, want still leased to relay-a at attempt 1", row)
			}
			if st, err := ob.Stats(context.Background()); err != nil || st.Pending != 1 || st.Leased != 1 {
				t.Errorf("stats after the kill: %+v, %v; want 1 pending, leased", st, err)
			}

			var second []outbox.Message
			var mu sync.Mutex
			b, err := outbox.NewRelay(ob, outbox.WithSender("send_receipt", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
				mu.Lock()
				second = append(second, m)
				mu.Unlock()
				return nil
			})), outbox.WithRelayID("relay-b"), outbox.WithPollInterval(20*time.Millisecond), outbox.WithMaxAttempts(tc.maxAttempts))
			if err != nil {
				t.Fatal(err)
			}
			stopB := runRelay(t, b)
			waitUntil(t, time.Minute, "relay-b to finish the row", func() bool { return outboxRows(t, db, ob)[key].state != "pending" })
			stopB()
			row = outboxRows(t, db, ob)[key]
			if row.state != tc.wantState || row.attempts != 2 {
				t.Errorf("row %+v, want %s after attempt 2", row, tc.wantState)
			}
			mu.Lock()
			defer mu.Unlock()
			switch tc.wantState {
			case "sent":
				if len(second) != 1 || second[0].IdempotencyKey != first.IdempotencyKey || second[0].Attempt != 2 || first.IdempotencyKey != key {
					t.Errorf("relay-b calls %+v after relay-a's %+v, want one with key %s at attempt 2", second, first, key)
				}
			case "dead":
				dead := log.of(outbox.EventDead)
				if len(second) != 0 || len(dead) != 1 || !errors.Is(dead[0].Err, outbox.ErrLeaseExpired) {
					t.Errorf("relay-b made %d calls, dead events %+v; want none and one ErrLeaseExpired", len(second), dead)
				}
			}
		})
	}
}

// TestOutboxLeaseLost checks that a relay whose call outlived its lease
// does not record the result once another relay has leased the row: only
// the relay holding the lease marks it sent.
func TestOutboxLeaseLost(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(4)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "slow")
	obA, err := outbox.New(db, "slow", outbox.WithTable(ob.Table()), outbox.WithObserver(log))
	if err != nil {
		t.Fatal(err)
	}
	key := enqueue(t, db, ob, "m-1", "call", `{}`)
	bStarted, aDone := make(chan struct{}), make(chan struct{})
	// Relay A's call ignores its context and returns only once relay B,
	// after A's lease expired, is calling too.
	a, err := outbox.NewRelay(obA, outbox.WithSender("call", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		<-bStarted
		return nil
	})), outbox.WithRelayID("relay-a"), outbox.WithLease(200*time.Millisecond), outbox.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, err := outbox.NewRelay(ob, outbox.WithSender("call", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		close(bStarted)
		<-aDone
		return nil
	})), outbox.WithRelayID("relay-b"), outbox.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopA := runRelay(t, a)
	waitUntil(t, time.Minute, "relay-a to lease the row", func() bool { return outboxRows(t, db, ob)[key].owner == "relay-a" })
	stopB := runRelay(t, b)
	waitUntil(t, time.Minute, "relay-a to record its call", func() bool {
		return log.Count(outbox.EventLeaseLost)+log.Count(outbox.EventSent) > 0
	})
	close(aDone)
	waitUntil(t, time.Minute, "relay-b to mark the row sent", func() bool { return outboxRows(t, db, ob)[key].state == "sent" })
	stopA()
	stopB()
	lost := log.of(outbox.EventLeaseLost)
	if len(lost) != 1 || lost[0].Relay != "relay-a" || !errors.Is(lost[0].Err, outbox.ErrLeaseLost) || log.Count(outbox.EventSent) != 0 {
		t.Errorf("relay-a's events: lease lost %+v, %d sent; want one ErrLeaseLost and none sent", lost, log.Count(outbox.EventSent))
	}
	if row := outboxRows(t, db, ob)[key]; row.attempts != 2 {
		t.Errorf("row %+v, want sent by relay-b at attempt 2", row)
	}
}

// TestOutboxNotifyWakesRelay checks that a commit wakes a listening relay
// whose poll interval is an hour.
func TestOutboxNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(4)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "notifier", outbox.WithObserver(log))
	got := make(chan string, 4)
	r, err := outbox.NewRelay(ob, outbox.WithSender("ping", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		got <- m.IdempotencyKey
		return nil
	})), outbox.WithListener(pgDSN), outbox.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	waitUntil(t, time.Minute, "the relay to listen", func() bool { return log.Count(outbox.EventListening) > 0 })
	// The first row may be found by the lease the subscription triggers; the
	// second can only be found through its notification.
	for i := range 2 {
		key := enqueue(t, db, ob, fmt.Sprintf("n-%d", i), "ping", `{}`)
		select {
		case k := <-got:
			if k != key {
				t.Fatalf("relay sent %s, want %s", k, key)
			}
		case <-time.After(time.Minute):
			t.Fatalf("row %d not sent a minute after commit: the notification did not wake the relay", i)
		}
	}
}

// TestOutboxListenerReconnects cuts the relay's LISTEN connection: the
// relay reconnects, says so, and is woken by the next commit again.
func TestOutboxListenerReconnects(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(4)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "reconnect", outbox.WithObserver(log))
	got := make(chan string, 4)
	r, err := outbox.NewRelay(ob, outbox.WithSender("ping", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		got <- m.IdempotencyKey
		return nil
	})), outbox.WithListener(pgDSN), outbox.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	waitUntil(t, time.Minute, "the relay to listen", func() bool { return log.Count(outbox.EventListening) == 1 })
	res, err := db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`, `LISTEN "`+ob.Channel()+`"`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("found %d LISTEN connections for %s, want 1", n, ob.Channel())
	}
	waitUntil(t, time.Minute, "the relay to listen again", func() bool { return log.Count(outbox.EventListening) == 2 })
	if log.Count(outbox.EventRelayError) == 0 {
		t.Error("the lost LISTEN connection was not reported")
	}
	// Drain the wake-up that follows the reconnection, then check that a
	// commit wakes the relay through the new connection.
	for i := range 2 {
		key := enqueue(t, db, ob, fmt.Sprintf("r-%d", i), "ping", `{}`)
		select {
		case k := <-got:
			if k != key {
				t.Fatalf("relay sent %s, want %s", k, key)
			}
		case <-time.After(time.Minute):
			t.Fatalf("row %d not sent a minute after commit: the relay is not woken after reconnecting", i)
		}
	}
}

// TestOutboxGracefulShutdown checks that Run waits for the call in flight
// when its context ends, and records its result.
func TestOutboxGracefulShutdown(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(4)
	ob, _ := newOutbox(t, db, "graceful")
	key := enqueue(t, db, ob, "m-1", "slow", `{}`)
	entered, release := make(chan struct{}), make(chan struct{})
	r, err := outbox.NewRelay(ob, outbox.WithSender("slow", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		close(entered)
		<-release
		return nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a call was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if row := outboxRows(t, db, ob)[key]; row.state != "sent" {
		t.Errorf("row %+v, want sent", row)
	}
}

// TestOutboxEnqueueBadInput checks that bad input is refused with a clear
// error before anything reaches the database: the transaction stays usable
// and commits nothing.
func TestOutboxEnqueueBadInput(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(2)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "input", outbox.WithObserver(log))
	for _, tc := range []struct {
		name    string
		msgKey  string
		kind    string
		payload []byte
		opts    []outbox.EnqueueOption
		want    error
	}{
		{"empty kind", "m", "", []byte(`{}`), nil, outbox.ErrInvalidKind},
		{"kind with a space", "m", "send mail", []byte(`{}`), nil, outbox.ErrInvalidKind},
		{"kind too long", "m", strings.Repeat("k", 129), []byte(`{}`), nil, outbox.ErrInvalidKind},
		{"nil payload", "m", "mail", nil, nil, outbox.ErrInvalidPayload},
		{"empty payload", "m", "mail", []byte{}, nil, outbox.ErrInvalidPayload},
		{"invalid JSON", "m", "mail", []byte(`{"to":`), nil, outbox.ErrInvalidPayload},
		{"invalid UTF-8", "m", "mail", []byte("\"\xff\""), nil, outbox.ErrInvalidPayload},
		{"empty message key", "", "mail", []byte(`{}`), nil, outbox.ErrInvalidKey},
		{"NUL in message key", "a\x00b", "mail", []byte(`{}`), nil, outbox.ErrInvalidKey},
		{"message key too long", strings.Repeat("m", 1025), "mail", []byte(`{}`), nil, outbox.ErrInvalidKey},
		{"empty idempotency key", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithKey("")}, outbox.ErrInvalidKey},
		{"idempotency key with a newline", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithKey("a\nb")}, outbox.ErrInvalidKey},
		{"idempotency key too long", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithKey(strings.Repeat("k", 256))}, outbox.ErrInvalidKey},
		{"empty ordering key", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("", 1)}, outbox.ErrInvalidOrder},
		{"sequence 0", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("account:1", 0)}, outbox.ErrInvalidOrder},
		{"negative sequence", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("account:1", -3)}, outbox.ErrInvalidOrder},
		{"ordering key too long", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder(strings.Repeat("a", outbox.MaxOrderKeyBytes+1), 1)}, outbox.ErrInvalidOrder},
		{"ordering key not UTF-8", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("a\xffb", 1)}, outbox.ErrInvalidOrder},
		{"ordering key with a newline", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("a\nb", 1)}, outbox.ErrInvalidOrder},
		{"ordering key with a NUL", "m", "mail", []byte(`{}`), []outbox.EnqueueOption{outbox.WithOrder("a\x00b", 1)}, outbox.ErrInvalidOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			_, err = ob.Enqueue(context.Background(), tx, tc.msgKey, tc.kind, tc.payload, tc.opts...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Enqueue: %v, want %v", err, tc.want)
			}
			var one int
			if err := tx.QueryRow("SELECT 1").Scan(&one); err != nil {
				t.Fatalf("transaction unusable after the refused Enqueue: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := ob.Enqueue(context.Background(), nil, "m", "mail", []byte(`{}`)); err == nil {
		t.Error("Enqueue with a nil transaction succeeded")
	}
	if rows := outboxRows(t, db, ob); len(rows) != 0 {
		t.Errorf("%d rows written by refused calls", len(rows))
	}
	if n := log.Count(outbox.EventEnqueued); n != 0 {
		t.Errorf("%d enqueued events for refused calls", n)
	}
}

// TestOutboxEnqueueKeys checks key derivation, explicit keys, duplicates and
// rollback.
func TestOutboxEnqueueKeys(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(2)
	log := newEventLog()
	ob, _ := newOutbox(t, db, "keys", outbox.WithObserver(log))
	ctx := context.Background()

	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	k1, err := ob.Enqueue(ctx, tx, "order-1", "email", []byte(`{"n": 1}`))
	if err != nil || k1 != outbox.Key("keys", "order-1", "email") {
		t.Fatalf("Enqueue = %q, %v; want the derived key", k1, err)
	}
	if _, err := ob.Enqueue(ctx, tx, "order-1", "email", []byte(`{"n": 2}`)); !errors.Is(err, outbox.ErrDuplicateKey) {
		t.Fatalf("second Enqueue of one kind for one message: %v, want ErrDuplicateKey", err)
	}
	k3, err := ob.Enqueue(ctx, tx, "order-1", "email", []byte(`{"n": 3}`), outbox.WithKey("order-1-reminder"))
	if err != nil || k3 != "order-1-reminder" {
		t.Fatalf("Enqueue WithKey = %q, %v", k3, err)
	}
	k4, err := ob.Enqueue(ctx, tx, "order-1", "sms", []byte(`{"n": 4}`))
	if err != nil || k4 == k1 {
		t.Fatalf("Enqueue of another kind = %q, %v; want a new key", k4, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after ErrDuplicateKey: %v", err)
	}

	tx, err = db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, tx, "order-2", "email", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	rows := outboxRows(t, db, ob)
	if len(rows) != 3 {
		t.Errorf("%d rows, want 3 (the duplicate and the rolled-back one are not written)", len(rows))
	}
	if _, ok := rows[outbox.Key("keys", "order-2", "email")]; ok {
		t.Error("a rolled-back Enqueue left a row")
	}
	var payload string
	if err := db.QueryRow("SELECT payload::text FROM "+ob.Table()+" WHERE idempotency_key = $1", k1).Scan(&payload); err != nil || payload != `{"n": 1}` {
		t.Errorf("payload %q, %v; want the first one, byte for byte", payload, err)
	}
}

// TestOutboxCleanup checks that only sent rows past the retention window
// are deleted, across several batches.
func TestOutboxCleanup(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(2)
	ob, _ := newOutbox(t, db, "cleanup", outbox.WithCleanupBatch(3))
	for i := range 12 {
		enqueue(t, db, ob, fmt.Sprintf("m-%d", i), "mail", `{}`)
	}
	// m-0..m-6 sent 2 days ago, m-7..m-8 sent just now, m-9 dead 2 days
	// ago, m-10..m-11 pending (m-11 created long ago).
	if _, err := db.Exec(`UPDATE ` + ob.Table() + ` SET
		state = CASE WHEN message_key IN ('m-9') THEN 'dead' WHEN message_key IN ('m-10', 'm-11') THEN 'pending' ELSE 'sent' END,
		sent_at = CASE WHEN message_key IN ('m-7', 'm-8') THEN now()
			WHEN message_key IN ('m-9', 'm-10', 'm-11') THEN NULL ELSE now() - interval '2 days' END,
		dead_at = CASE WHEN message_key = 'm-9' THEN now() - interval '2 days' END,
		created_at = CASE WHEN message_key = 'm-11' THEN now() - interval '1 hour' ELSE created_at END`); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Cleanup(context.Background(), 0); err == nil {
		t.Error("Cleanup with zero retention succeeded")
	}
	n, err := ob.Cleanup(context.Background(), 24*time.Hour)
	if err != nil || n != 7 {
		t.Fatalf("Cleanup = %d, %v; want 7", n, err)
	}
	left := map[string]bool{}
	for _, r := range outboxRows(t, db, ob) {
		left[r.msgKey] = true
	}
	for _, k := range []string{"m-7", "m-8", "m-9", "m-10", "m-11"} {
		if !left[k] {
			t.Errorf("%s was deleted", k)
		}
	}
	if len(left) != 5 {
		t.Errorf("%d rows left, want 5", len(left))
	}
	st, err := ob.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 2 || st.Dead != 1 || st.Leased != 0 || st.OldestPending < 59*time.Minute || st.OldestPending > 2*time.Hour {
		t.Errorf("stats %+v, want 2 pending, the oldest about an hour old, and 1 dead", st)
	}
}

// TestOutboxNoTable checks that a missing table is reported as ErrNoTable.
func TestOutboxNoTable(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(2)
	schema := tempSchema(t, db)
	ob, err := outbox.New(db, "missing", outbox.WithTable(schema+".nothing_here"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ob.Enqueue(context.Background(), tx, "m", "mail", []byte(`{}`))
	_ = tx.Rollback()
	if !errors.Is(err, outbox.ErrNoTable) {
		t.Errorf("Enqueue: %v, want ErrNoTable", err)
	}
	if _, err := ob.Stats(context.Background()); !errors.Is(err, outbox.ErrNoTable) {
		t.Errorf("Stats: %v, want ErrNoTable", err)
	}
	r, err := outbox.NewRelay(ob, outbox.WithSender("mail", outbox.SenderFunc(func(context.Context, outbox.Message) error { return nil })))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrNoTable) {
		t.Errorf("Run: %v, want ErrNoTable", err)
	}
}

// TestOutboxCarriesEventTime checks that the event time a call is enqueued
// with reaches its Sender, at the same instant, and that a call enqueued
// without one reaches it as the zero time, through the real table and
// relay.
func TestOutboxCarriesEventTime(t *testing.T) {
	db := openAsyncDB(t)
	ob, _ := newOutbox(t, db, "event-times", outbox.WithoutNotify())
	at := time.Date(2026, 11, 30, 23, 59, 58, 123456000, time.FixedZone("CET", 3600))
	enqueue(t, db, ob, "order-1", "replay", `{"n":1}`, outbox.WithEventTime(at))
	enqueue(t, db, ob, "order-2", "replay", `{"n":2}`)
	got := relayedEventTimes(t, ob, "replay", 2)
	if !got["order-1"].Equal(at) {
		t.Errorf("order-1 reached the Sender with event time %v, want %v", got["order-1"], at)
	}
	if !got["order-2"].IsZero() {
		t.Errorf("order-2 reached the Sender with event time %v, want the zero time", got["order-2"])
	}
}

// TestOutboxEventTimeKeepsItsDay: a call enqueued with an event time in the
// last microsecond of its day — 23:59:59.9999996Z; Go's end-of-day idiom,
// day.Add(24*time.Hour - time.Nanosecond), lands there too — reaches its
// Sender at the same instant, never the next day's midnight. A dead letter
// the Sender publishes with it, replayed, and a re-send of the original are
// then one claim, on the event's day, and one effect, on a claim table
// partitioned by event day.
func TestOutboxEventTimeKeepsItsDay(t *testing.T) {
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, at := range []time.Time{day.Add(24*time.Hour - 400*time.Nanosecond), day.Add(24*time.Hour - time.Nanosecond)} {
		t.Run(at.Format(time.RFC3339Nano), func(t *testing.T) {
			l, _ := partitionedLoyalty(t, day.Add(24*time.Hour+30*time.Second), 2)
			ob := testenv.Outbox(t, l.db, l.schema, "loyalty")
			o := orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 500}
			// The original's delivery was poison: its dead letter is a row
			// with its event time, as every adapter's WithDeadLetter writes.
			enqueue(t, l.db, ob, o.key(), "dead-letter", `{"order_id": 1}`, outbox.WithEventTime(at))
			sent := relayedEventTimes(t, ob, "dead-letter", 1)[o.key()]
			if !sent.Equal(at) {
				t.Errorf("the Sender got event time %s, want %s", sent.UTC().Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
			}
			// The dead letter replayed, with the event time its Sender
			// carries, and a re-send of the original.
			var outcomes []idempotent.Outcome
			for _, et := range []time.Time{sent, at} {
				out, err := l.mw.ProcessMessage(context.Background(), idempotent.Message{Key: o.key(), EventTime: et}, func(ctx context.Context, tx *sql.Tx) error {
					return l.credit(ctx, tx, o)
				})
				if err != nil {
					t.Fatal(err)
				}
				outcomes = append(outcomes, out)
			}
			if days := testenv.ClaimDays(t, l.db, l.schema, o.key()); !slices.Equal(days, []string{"2026-11-30"}) {
				t.Errorf("claims of %s on days %v, want [2026-11-30]; outcomes %v", o.key(), days, outcomes)
			}
			testenv.AuditLedger(t, l.db, l.schema, 1, map[int64]int64{1: 5})
		})
	}
}

// TestOutboxSchemaGainsEventTimeNs: an outbox table made before
// event_time_ns existed gains it from EnsureSchema; its rows written
// without it are read with their event_time alone, and new rows keep their
// event time to the nanosecond.
func TestOutboxSchemaGainsEventTimeNs(t *testing.T) {
	db := openAsyncDB(t)
	ob, schema := newOutbox(t, db, "upgrade", outbox.WithoutNotify())
	table := pq.QuoteIdentifier(schema) + ".outbox"
	if _, err := db.Exec("ALTER TABLE " + table + " DROP COLUMN event_time_ns"); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC)
	if _, err := db.Exec("INSERT INTO "+table+" (consumer, message_key, kind, idempotency_key, payload, event_time) VALUES ('upgrade', 'order-1', 'replay', 'k1', '{}', $1)", old); err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 23, 59, 59, 999999999, time.UTC)
	enqueue(t, db, ob, "order-2", "replay", `{}`, outbox.WithEventTime(at))
	got := relayedEventTimes(t, ob, "replay", 2)
	if !got["order-1"].Equal(old) || !got["order-2"].Equal(at) {
		t.Errorf("event times %s and %s, want %s (a row from before event_time_ns) and %s",
			got["order-1"].UTC().Format(time.RFC3339Nano), got["order-2"].UTC().Format(time.RFC3339Nano), old.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
	}
}

// relayedEventTimes runs a relay whose Sender for kind takes note of each
// call's Message.EventTime (the zero time for none), until n calls were
// sent, and returns them by message key.
func relayedEventTimes(t testing.TB, ob *outbox.Outbox, kind string, n int) map[string]time.Time {
	t.Helper()
	var mu sync.Mutex
	got := map[string]time.Time{}
	r, err := outbox.NewRelay(ob, outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithSender(kind, outbox.SenderFunc(func(_ context.Context, m outbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[m.MessageKey] = m.EventTime
			return nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)
	waitUntil(t, time.Minute, "the calls sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == n
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestOutboxSchemaGainsOrder: a table made before WithOrder existed gains
// order_key and order_seq from EnsureSchema; its old rows relay with no
// order, new ones with theirs, and an ordering key at the limit is stored
// whole.
func TestOutboxSchemaGainsOrder(t *testing.T) {
	db := openAsyncDB(t)
	ob, schema := newOutbox(t, db, "upgrade", outbox.WithoutNotify())
	table := pq.QuoteIdentifier(schema) + ".outbox"
	if _, err := db.Exec("ALTER TABLE " + table + " DROP COLUMN order_key, DROP COLUMN order_seq"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO " + table + " (consumer, message_key, kind, idempotency_key, payload) VALUES ('upgrade', 'old', 'ledger', 'k1', '{}')"); err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", outbox.MaxOrderKeyBytes/2)
	enqueue(t, db, ob, "new", "ledger", `{}`, outbox.WithOrder("account:7", 3))
	enqueue(t, db, ob, "long", "ledger", `{}`, outbox.WithOrder(long, 1))
	var mu sync.Mutex
	got := map[string]string{}
	r, err := outbox.NewRelay(ob, outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithSender("ledger", outbox.SenderFunc(func(_ context.Context, m outbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[m.MessageKey] = fmt.Sprintf("%s/%d", m.OrderKey, m.OrderSeq)
			return nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)
	waitUntil(t, time.Minute, "the calls sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if got["old"] != "/0" || got["new"] != "account:7/3" || got["long"] != long+"/1" {
		t.Errorf("relayed orders %q; want none for the old row, account:7/3 and the long key's", got)
	}
}
