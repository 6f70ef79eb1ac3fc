package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
)

// outboxOptions is what -outbox measures: the relay's throughput over
// rows pending rows per run, rounds times, and the delay from commit to
// call over messages enqueued at 100 a second.
type outboxOptions struct {
	rows, messages, rounds int
}

// parseOutbox sets the plan's -outbox from its flags' values, when on.
func (p *plan) parseOutbox(on bool, rows, messages, rounds int) error {
	if !on {
		return nil
	}
	if rows < 1 {
		return fmt.Errorf("-outbox-rows: %d is not a positive number", rows)
	}
	if messages < 1 {
		return fmt.Errorf("-outbox-messages: %d is not a positive number", messages)
	}
	p.outbox = &outboxOptions{rows: rows, messages: messages, rounds: rounds}
	return nil
}

// outboxConfig is one relay setting of the throughput table.
type outboxConfig struct {
	relays, concurrency, batch int
	async, fresh               bool
}

var outboxConfigs = []outboxConfig{
	{1, 16, 16, false, false},
	{1, 64, 64, false, false},
	{4, 16, 16, false, false},
	{1, 16, 16, true, false},
	{1, 64, 64, true, false},
	{4, 16, 16, true, false},
	{1, 64, 64, false, true},
}

// outboxWakeUp is one way the relay learns of a new row, a row of the
// delay table.
type outboxWakeUp struct {
	name   string
	listen bool
	poll   time.Duration
}

var outboxWakeUps = []outboxWakeUp{
	{"NOTIFY (poll 1s as fallback)", true, time.Second},
	{"polling every 1s (default)", false, time.Second},
	{"polling every 100ms", false, 100 * time.Millisecond},
}

// outboxRate is the delay measurement's commits per second.
const outboxRate = 100

// outboxProvider is a local no-op HTTP provider that records when each
// idempotency key first arrives, and the Sender that calls it.
type outboxProvider struct {
	srv    *httptest.Server
	client *http.Client
	mu     sync.Mutex
	first  map[string]time.Time
}

func newOutboxProvider() *outboxProvider {
	p := &outboxProvider{first: map[string]time.Time{}, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		if _, ok := p.first[key]; !ok {
			p.first[key] = now
		}
		p.mu.Unlock()
	}))
	return p
}

func (p *outboxProvider) close() {
	p.client.CloseIdleConnections()
	p.srv.Close()
}

func (p *outboxProvider) sender() outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey)
		resp, err := p.client.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
}

func (p *outboxProvider) reset() {
	p.mu.Lock()
	clear(p.first)
	p.mu.Unlock()
}

func (p *outboxProvider) arrived() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.first)
}

// runOutbox measures the relay against a local no-op provider: its
// throughput in calls per second for each of outboxConfigs, in rounds
// that interleave them, and the delay from the enqueueing commit to the
// provider's call for each of outboxWakeUps. It writes a Markdown section
// to w.
func runOutbox(ctx context.Context, dsn string, o outboxOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	p := newOutboxProvider()
	defer p.close()
	// Rounds interleave the configurations, so that a busy moment on the
	// machine hits them all alike; the table shows the median.
	results := make([][]float64, len(outboxConfigs))
	for round := range o.rounds {
		for i, c := range outboxConfigs {
			r, err := outboxThroughput(ctx, dsn, p, o.rows, c)
			if err != nil {
				return fmt.Errorf("round %d, config %d: %w", round, i, err)
			}
			fmt.Fprintf(log, "round %d, %d × %d (%d), async %v, fresh %v: %.0f calls/s\n", round, c.relays, c.concurrency, c.batch, c.async, c.fresh, r)
			results[i] = append(results[i], r)
		}
	}
	delays := make([][]time.Duration, len(outboxWakeUps))
	for i, wu := range outboxWakeUps {
		if delays[i], err = outboxDelay(ctx, dsn, p, o.messages, wu); err != nil {
			return fmt.Errorf("%s: %w", wu.name, err)
		}
		fmt.Fprintf(log, "%s: %d calls\n", wu.name, len(delays[i]))
	}
	outboxReport(w, server, args, o, started, time.Since(started), results, delays)
	return nil
}

// outboxThroughput relays rows pending rows to the provider with the
// relays of c and returns calls per second, from the relays' start to no
// row pending.
func outboxThroughput(ctx context.Context, dsn string, p *outboxProvider, rows int, c outboxConfig) (perSecond float64, err error) {
	db, err := outboxDB(dsn, c.async)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	ob, drop, err := outboxTable(ctx, db)
	if err != nil {
		return 0, err
	}
	defer drop()
	if _, err := db.ExecContext(ctx, `INSERT INTO `+ob.Table()+` (consumer, message_key, kind, idempotency_key, payload)
		SELECT 'bench', 'm-' || g, 'noop', md5(g::text), '{"n": 1}' FROM generate_series(1, $1) g`, rows); err != nil {
		return 0, err
	}
	if !c.fresh {
		// What autovacuum does for a table that filled up.
		if _, err := db.ExecContext(ctx, `ANALYZE `+ob.Table()); err != nil {
			return 0, err
		}
	}
	p.reset()
	start := time.Now()
	var stops []func() error
	defer func() {
		for _, stop := range stops {
			err = errors.Join(err, stop())
		}
	}()
	for range c.relays {
		r, err := outbox.NewRelay(ob, outbox.WithSender("noop", p.sender()), outbox.WithPollInterval(50*time.Millisecond),
			outbox.WithConcurrency(c.concurrency), outbox.WithBatch(c.batch))
		if err != nil {
			return 0, err
		}
		stops = append(stops, startRelay(ctx, r))
	}
	if err := pollUntil(ctx, 5*time.Minute, "every row to be sent", func() (bool, error) {
		st, err := ob.Stats(ctx)
		return err == nil && st.Pending == 0, err
	}); err != nil {
		return 0, err
	}
	return float64(rows) / time.Since(start).Seconds(), nil
}

// outboxDelay enqueues messages rows at outboxRate commits per second,
// each in a transaction of its own, with a relay woken as wu says, and
// returns the delays from each COMMIT returning to the provider's call,
// in order.
func outboxDelay(ctx context.Context, dsn string, p *outboxProvider, messages int, wu outboxWakeUp) (delays []time.Duration, err error) {
	db, err := outboxDB(dsn, false)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	ob, drop, err := outboxTable(ctx, db)
	if err != nil {
		return nil, err
	}
	defer drop()
	opts := []outbox.RelayOption{outbox.WithSender("noop", p.sender()), outbox.WithPollInterval(wu.poll)}
	if wu.listen {
		opts = append(opts, outbox.WithListener(dsn))
	}
	listening := make(chan struct{})
	var once sync.Once
	ob2, err := outbox.New(db, "bench", outbox.WithTable(ob.Table()), outbox.WithObserver(outbox.ObserverFunc(func(_ context.Context, e outbox.Event) {
		if e.Type == outbox.EventListening {
			once.Do(func() { close(listening) })
		}
	})))
	if err != nil {
		return nil, err
	}
	r, err := outbox.NewRelay(ob2, opts...)
	if err != nil {
		return nil, err
	}
	p.reset()
	stop := startRelay(ctx, r)
	stopped := false
	defer func() {
		if !stopped {
			err = errors.Join(err, stop())
		}
	}()
	if wu.listen {
		select {
		case <-listening:
		case <-time.After(time.Minute):
			return nil, errors.New("the relay did not listen within a minute")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	committed := map[string]time.Time{}
	tick := time.NewTicker(time.Second / outboxRate)
	for i := range messages {
		<-tick.C
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			tick.Stop()
			return nil, err
		}
		key, err := ob.Enqueue(ctx, tx, fmt.Sprintf("m-%d", i), "noop", []byte(`{}`))
		if err != nil {
			_ = tx.Rollback()
			tick.Stop()
			return nil, err
		}
		if err := tx.Commit(); err != nil {
			tick.Stop()
			return nil, err
		}
		committed[key] = time.Now()
	}
	tick.Stop()
	if err := pollUntil(ctx, time.Minute, "every row to be sent", func() (bool, error) { return p.arrived() >= messages, nil }); err != nil {
		return nil, err
	}
	stopped = true
	if err := stop(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	for key, at := range committed {
		delays = append(delays, p.first[key].Sub(at))
	}
	p.mu.Unlock()
	slices.Sort(delays)
	return delays, nil
}

// outboxReport writes the section of -outbox: calls/s by round for each
// of outboxConfigs, and the delays of each of outboxWakeUps, sorted.
func outboxReport(w io.Writer, server string, args []string, o outboxOptions, started time.Time, took time.Duration, results [][]float64, delays [][]time.Duration) {
	fmt.Fprintf(w, "## Outbox relay\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; lib/pq; a local no-op HTTP provider (`httptest`) in the same process.\n\n", runLine(started, took, server))
	fmt.Fprintf(w, "Relay throughput: %s pending rows per run; the rounds interleave the configurations; median of %d (min–max):\n\n", thousands(o.rows), o.rounds)
	fmt.Fprintf(w, "| relays × concurrency (batch) | relay sessions | table | calls/s, median of %d (min–max) |\n|---|---|---|---|\n", o.rounds)
	for i, c := range outboxConfigs {
		mode, table := "synchronous_commit on", "analyzed"
		if c.async {
			mode = "synchronous_commit off"
		}
		if c.fresh {
			table = "never analyzed"
		}
		r := slices.Clone(results[i])
		slices.Sort(r)
		fmt.Fprintf(w, "| %d × %d (%d) | %s | %s | %.0f (%.0f–%.0f) |\n", c.relays, c.concurrency, c.batch, mode, table, r[len(r)/2], r[0], r[len(r)-1])
	}
	fmt.Fprintf(w, "\nDelay from the enqueueing transaction's `COMMIT` returning to the provider receiving the call: %s messages at %d commits per second:\n\n", thousands(o.messages), outboxRate)
	fmt.Fprintf(w, "| wake-up | p50 | p99 | max |\n|---|---|---|---|\n")
	for i, wu := range outboxWakeUps {
		d := delays[i]
		pct := func(p float64) time.Duration { return d[int(p*float64(len(d)-1))] }
		fmt.Fprintf(w, "| %s | %v | %v | %v |\n", wu.name, pct(0.50).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), d[len(d)-1].Round(100*time.Microsecond))
	}
}

// outboxDB opens a pool on dsn (lib/pq); with async, synchronous_commit is
// off in every session: commits return without waiting for the WAL to
// reach the disk.
func outboxDB(dsn string, async bool) (*sql.DB, error) {
	if !async {
		return sql.Open("postgres", dsn)
	}
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.Runtime == nil {
		cfg.Runtime = map[string]string{}
	}
	cfg.Runtime["synchronous_commit"] = "off"
	c, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// outboxTable returns an Outbox for consumer bench on a table of a schema
// of its own, created with EnsureSchema, and the function that drops the
// schema.
func outboxTable(ctx context.Context, db *sql.DB) (*outbox.Outbox, func(), error) {
	schema := testenv.UniqueName("outbox")
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+pq.QuoteIdentifier(schema)); err != nil {
		return nil, nil, err
	}
	drop := func() {
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA "+pq.QuoteIdentifier(schema)+" CASCADE")
	}
	ob, err := outbox.New(db, "bench", outbox.WithTable(schema+".outbox"))
	if err == nil {
		err = ob.EnsureSchema(ctx)
	}
	if err != nil {
		drop()
		return nil, nil, err
	}
	return ob, drop, nil
}

// startRelay runs r until the returned stop function is called; stop
// cancels Run's context, waits for it to return and returns its error.
func startRelay(ctx context.Context, r *outbox.Relay) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		cancel()
		if err := <-done; err != nil {
			return fmt.Errorf("relay %s: Run: %w", r.ID(), err)
		}
		return nil
	}
}

// pollUntil calls cond every 20ms until it holds, and fails after within.
func pollUntil(ctx context.Context, within time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", within, what)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
