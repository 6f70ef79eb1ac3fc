package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// consumerEnv holds, in a consumer process's environment, its
// consumerConfig as JSON. A process started with it runs as a consumer.
const consumerEnv = "IDEMPOTENT_SOAK_CONSUMER"

// consumerConfig is what the coordinator tells a consumer process.
type consumerConfig struct {
	DSN      string
	Lane     string
	Instance string // "read_committed/1#3": lane, slot, incarnation
	Workers  int
	Coalesce int // WithCoalescing's Max, 0 for none
	Lease    time.Duration
}

// report is a consumer's running totals, printed as one JSON line on
// standard output every reportEvery and once more, with Final set, at a
// clean exit. The coordinator keeps the last line of every instance, so a
// SIGKILLed consumer loses at most the counts of its last interval.
type report struct {
	Instance     string
	Lane         string
	Final        bool
	Applied      int64
	Duplicates   int64
	Failed       int64
	Retries      int64
	RetryReasons map[string]int64
	FailReasons  map[string]int64
	LeaseErrors  int64
	AckErrors    int64
	Redelivered  int64 // leases of a delivery leased before: its consumer died or its ack was lost
	InUse        int   // db.Stats().InUse at exit, before Close
	OpenConns    int   // db.Stats().OpenConnections at exit, before Close
}

const reportEvery = 200 * time.Millisecond

// soakObserver is idempotent.Counts plus a count of retries by reason.
type soakObserver struct {
	idempotent.Counts
	mu      sync.Mutex
	reasons map[string]int64
}

func (o *soakObserver) Retry(ctx context.Context, e idempotent.RetryEvent) {
	o.Counts.Retry(ctx, e)
	o.mu.Lock()
	o.reasons[e.Reason]++
	o.mu.Unlock()
}

func (o *soakObserver) reasonCounts() map[string]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]int64, len(o.reasons))
	for k, v := range o.reasons {
		m[k] = v
	}
	return m
}

// delivery is one leased inbox row.
type delivery struct {
	id, orderID, customerID, points int64
	handlerDelayMS, commitDelayMS   int
	leases                          int
}

func (d delivery) key() string { return "order-completed:" + strconv.FormatInt(d.orderID, 10) }

// consumer is one consumer process: Workers goroutines leasing deliveries
// from the lane's inbox and crediting points through the middleware.
type consumer struct {
	cfg  consumerConfig
	lane lane
	db   *sql.DB
	mw   *idempotent.Middleware
	obs  *soakObserver

	leaseSQL, ackSQL string

	mu          sync.Mutex
	failReasons map[string]int64
	leaseErrors atomic.Int64
	ackErrors   atomic.Int64
	redelivered atomic.Int64
}

// runConsumerFromEnv runs a consumer process configured by consumerEnv and
// returns its exit code.
func runConsumerFromEnv() int {
	var cfg consumerConfig
	if err := json.Unmarshal([]byte(os.Getenv(consumerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "soak consumer: bad %s: %v\n", consumerEnv, err)
		return 2
	}
	if err := runConsumer(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "soak consumer %s: %v\n", cfg.Instance, err)
		return 1
	}
	return 0
}

func runConsumer(cfg consumerConfig) error {
	l, err := laneByName(cfg.Lane)
	if err != nil {
		return err
	}
	db, err := idempotent.OpenGuarded("postgres", cfg.DSN)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(cfg.Workers + 1)
	db.SetMaxIdleConns(cfg.Workers + 1)
	obs := &soakObserver{reasons: map[string]int64{}}
	opts := []idempotent.Option{}
	if cfg.Coalesce > 0 {
		opts = append(opts, idempotent.WithCoalescing(idempotent.Coalescing{Max: cfg.Coalesce, Wait: time.Millisecond}))
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append(opts,
		idempotent.WithTable(l.claimTable()),
		idempotent.WithTxOptions(sql.TxOptions{Isolation: l.isolation}),
		// Patient enough to ride out a server restart (crash recovery takes
		// about a second here); a delivery that still fails is not acked and
		// comes back when its lease expires.
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 30, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 250 * time.Millisecond}),
		idempotent.WithObserver(obs))...)
	if err != nil {
		_ = db.Close()
		return err
	}
	c := &consumer{
		cfg: cfg, lane: l, db: db, mw: mw, obs: obs, failReasons: map[string]int64{},
		leaseSQL: `UPDATE ` + l.q("inbox") + ` SET lease_until = now() + $1 * interval '1 millisecond', deliveries = deliveries + 1
WHERE id = (SELECT id FROM ` + l.q("inbox") + `
            WHERE available_at <= now() AND (lease_until IS NULL OR lease_until <= now())
            ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, order_id, customer_id, points, handler_delay_ms, commit_delay_ms, deliveries`,
		ackSQL: `DELETE FROM ` + l.q("inbox") + ` WHERE id = $1`,
	}

	stop := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sigs; close(stop) }()

	ctx := context.Background()
	// Every process creates the claim table on start, as a deployment
	// would: EnsureSchema is safe to run from many processes at once.
	for {
		if err := mw.EnsureSchema(ctx); err == nil {
			break
		} else if stopped(stop) {
			return fmt.Errorf("stopped before the schema was ensured: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(ctx, stop)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	enc := json.NewEncoder(os.Stdout)
	for {
		select {
		case <-tick.C:
			_ = enc.Encode(c.report(false))
		case <-done:
			_ = enc.Encode(c.report(true))
			return db.Close()
		}
	}
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

func (c *consumer) report(final bool) report {
	r := report{
		Instance: c.cfg.Instance, Lane: c.cfg.Lane, Final: final,
		Applied: c.obs.Applied(), Duplicates: c.obs.Duplicates(), Failed: c.obs.Failed(),
		Retries: c.obs.Retries(), RetryReasons: c.obs.reasonCounts(),
		LeaseErrors: c.leaseErrors.Load(), AckErrors: c.ackErrors.Load(), Redelivered: c.redelivered.Load(),
	}
	c.mu.Lock()
	r.FailReasons = make(map[string]int64, len(c.failReasons))
	for k, v := range c.failReasons {
		r.FailReasons[k] = v
	}
	c.mu.Unlock()
	if final {
		st := c.db.Stats()
		r.InUse, r.OpenConns = st.InUse, st.OpenConnections
	}
	return r
}

// work leases, processes and acks deliveries until stop is closed. A
// delivery whose Process fails is not acked: its lease expires and it is
// delivered again, as a broker would after a nack or a lost consumer.
func (c *consumer) work(ctx context.Context, stop <-chan struct{}) {
	for !stopped(stop) {
		d, ok, err := c.lease(ctx)
		if err != nil {
			c.leaseErrors.Add(1)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if d.leases > 1 {
			c.redelivered.Add(1)
		}
		_, err = c.mw.ProcessMessage(ctx, idempotent.Message{Key: d.key()}, func(ctx context.Context, tx *sql.Tx) error { return c.credit(ctx, tx, d) })
		if err != nil {
			c.fail(err)
			continue
		}
		if _, err := c.db.ExecContext(ctx, c.ackSQL, d.id); err != nil {
			c.ackErrors.Add(1) // delivered again after the lease: a duplicate
		}
	}
}

func (c *consumer) lease(ctx context.Context) (delivery, bool, error) {
	var d delivery
	err := c.db.QueryRowContext(ctx, c.leaseSQL, c.cfg.Lease.Milliseconds()).
		Scan(&d.id, &d.orderID, &d.customerID, &d.points, &d.handlerDelayMS, &d.commitDelayMS, &d.leases)
	if errors.Is(err, sql.ErrNoRows) {
		return d, false, nil
	}
	return d, err == nil, err
}

// credit is the guide's effect: add the order's points to the customer's
// balance and write a ledger row. A share of deliveries first sleeps in
// the handler, and a share of ledger rows sleeps at COMMIT (the deferred
// trigger), so the fault injector finds backends in both windows.
func (c *consumer) credit(ctx context.Context, tx *sql.Tx, d delivery) error {
	if d.handlerDelayMS > 0 {
		if _, err := tx.ExecContext(ctx, "SELECT pg_sleep($1 / 1000.0)", d.handlerDelayMS); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+c.lane.q("balances")+" SET points = points + $1 WHERE customer_id = $2", d.points, d.customerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+c.lane.q("point_ledger")+" (customer_id, order_id, points, commit_delay_ms) VALUES ($1, $2, $3, $4)",
		d.customerID, d.orderID, d.points, d.commitDelayMS)
	return err
}

// fail counts a failed delivery by the reason callers would branch on.
func (c *consumer) fail(err error) {
	reason := "other"
	switch {
	case errors.Is(err, idempotent.ErrRetriesExhausted):
		reason = "retries_exhausted"
	case errors.Is(err, idempotent.ErrClaimBusy):
		reason = "claim_busy"
	case errors.Is(err, idempotent.ErrAutocommit):
		reason = "autocommit"
	case errors.Is(err, idempotent.ErrInvalidKey):
		reason = "invalid_key"
	case postgres.New().Classify(err).Retryable():
		// The connection was lost while the middleware was rolling back
		// or beginning, and the classification reached the caller.
		reason = "connection"
	}
	c.mu.Lock()
	c.failReasons[reason]++
	c.mu.Unlock()
	if reason == "other" || reason == "autocommit" || reason == "invalid_key" {
		fmt.Fprintf(os.Stderr, "soak consumer %s: unexpected failure: %v\n", c.cfg.Instance, err)
	}
}
