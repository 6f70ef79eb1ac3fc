package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/loyaltyload"
	"github.com/txclaim/idempotent/kafka"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
	"github.com/txclaim/idempotent/redisstream"
)

// adaptersOptions is what -adapters measures.
type adaptersOptions struct {
	workers  int
	messages int
	coalesce int // with it, each consumer also runs on a Middleware WithCoalescing of groups of up to coalesce
	conns    int // with coalesce, the pool both of its cells run on; 0 is the shared pool
	rounds   int
	natsURL  string
	amqpURL  string
	redisURL string
	only     []string // the consumers to run, in the report's order
}

// Default brokers of -adapters: the local servers.
const (
	localNATS  = "nats://127.0.0.1:4222"
	localAMQP  = "amqp://guest:guest@127.0.0.1:5672/"
	localRedis = "redis://127.0.0.1:6379/0"
)

// adapterNames are the per-message consumers -adapters measures, after
// the baseline "process".
var adapterNames = []string{"process", "nats", "rabbitmq", "kafka", "redisstream"}

// adapterLabels describe them in the report.
var adapterLabels = map[string]string{
	"process":     "`Middleware.ProcessMessage`, one goroutine per worker, messages from memory",
	"nats":        "`nats.NewConsumer` on the local JetStream server (file storage, R1), default fetch size",
	"rabbitmq":    "`rabbitmq.NewConsumer` on the local RabbitMQ (classic durable queue, persistent messages)",
	"kafka":       "`kafka.NewConsumer` (per record, offset advance folded into the claim) on kfake, 8 partitions",
	"redisstream": "`redisstream.NewConsumer` on the local Redis (one stream, a consumer group)",
}

// adapterCell is one consumer's cell of one round.
type adapterCell struct {
	rate    float64 // messages applied per second, first to last
	elapsed time.Duration
	err     error
}

// adapterBench is one -adapters run's database, schema and brokers.
type adapterBench struct {
	o      adaptersOptions
	db     *sql.DB
	small  *sql.DB // the pool of -adapters-conns, nil without it
	schema *loyaltyload.Schema
	table  string
	update string
	ledger string
	cell   atomic.Int64 // numbers the cells: consumer names, streams, queues, topics
	tag    string       // this run's own, in every name it creates
	log    io.Writer
}

// benchOrder is the message every consumer applies: so many points for a
// customer.
type benchOrder struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// runAdapters measures each adapter's per-message consumer against
// ProcessMessage driven by as many goroutines, with the same effect, and
// writes a Markdown section to w.
func runAdapters(ctx context.Context, dsn string, o adaptersOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// Head to head, a consumer and the baseline run at once.
	db.SetMaxOpenConns(2*o.workers + 4)
	db.SetMaxIdleConns(2*o.workers + 4)
	var server string
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&server); err != nil {
		return fmt.Errorf("connect to %s: %w", dsn, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	schema, err := loyaltyload.Setup(ctx, db, "bench_adapters_"+tag, 100000)
	if err != nil {
		return err
	}
	defer func() {
		if err := schema.Drop(context.Background(), db); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	q := pq.QuoteIdentifier(schema.Name)
	ab := &adapterBench{o: o, db: db, schema: schema, table: schema.Name + ".processed_messages", tag: tag, log: log,
		update: "UPDATE " + q + ".balances SET points = points + $1 WHERE customer_id = $2",
		ledger: "INSERT INTO " + q + ".point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)"}
	if slices.Contains(o.only, "kafka") {
		if err := kafka.EnsureSchema(ctx, db, schema.Name+".kafka_offsets"); err != nil {
			return fmt.Errorf("-adapters: kafka offsets table: %w", err)
		}
	}
	if o.coalesce > 0 && o.conns > 0 {
		if ab.small, err = sql.Open("postgres", dsn); err != nil {
			return err
		}
		defer ab.small.Close()
		ab.small.SetMaxOpenConns(o.conns)
		ab.small.SetMaxIdleConns(o.conns)
	}
	res, coalesced, perSmall := map[string][]adapterCell{}, map[string][]adapterCell{}, map[string][]adapterCell{}
	h2h := map[string][]float64{}
	for r := range o.rounds {
		// Each round starts from another consumer.
		order := slices.Clone(o.only)
		k := r % len(order)
		order = append(order[k:], order[:k]...)
		for _, name := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			c := ab.measure(ctx, name, false, ab.db)
			res[name] = append(res[name], c)
			fmt.Fprintf(log, "adapters round %d/%d  %-11s %2d workers  %6.0f msgs/s  %v\n", r+1, o.rounds, name, o.workers, c.rate, c.err)
			if c.err != nil {
				return fmt.Errorf("-adapters: %s: %w", name, c.err)
			}
			if o.coalesce > 0 && ab.small != nil {
				c := ab.measure(ctx, name, false, ab.small)
				perSmall[name] = append(perSmall[name], c)
				fmt.Fprintf(log, "adapters round %d/%d  %-11s %2d workers  %d conns    %6.0f msgs/s  %v\n", r+1, o.rounds, name, o.workers, o.conns, c.rate, c.err)
				if c.err != nil {
					return fmt.Errorf("-adapters: %s on %d connections: %w", name, o.conns, c.err)
				}
			}
			if o.coalesce > 0 {
				pool := ab.db
				if ab.small != nil {
					pool = ab.small
				}
				c := ab.measure(ctx, name, true, pool)
				coalesced[name] = append(coalesced[name], c)
				fmt.Fprintf(log, "adapters round %d/%d  %-11s %2d workers  coalesced  %6.0f msgs/s  %v\n", r+1, o.rounds, name, o.workers, c.rate, c.err)
				if c.err != nil {
					return fmt.Errorf("-adapters: %s coalesced: %w", name, c.err)
				}
			}
			if name == "process" {
				continue
			}
			ratio, err := ab.headToHead(ctx, name)
			if errors.Is(err, errNoOverlap) {
				// A loaded machine can start one run so late that the other
				// is done first: the round measures nothing, and says so.
				fmt.Fprintf(log, "adapters round %d/%d  %-11s %2d workers  head to head with process: %v\n", r+1, o.rounds, name, o.workers, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("-adapters: %s head to head: %w", name, err)
			}
			h2h[name] = append(h2h[name], ratio)
			fmt.Fprintf(log, "adapters round %d/%d  %-11s %2d workers  head to head with process: %.3f\n", r+1, o.rounds, name, o.workers, ratio)
		}
	}
	adaptersReport(w, o, server, args, started, time.Since(started), res, h2h)
	if o.coalesce > 0 {
		per := res
		if ab.small != nil {
			per = perSmall
		}
		coalescedReport(w, o, per, coalesced)
	}
	return nil
}

// coalescedReport writes the table of each consumer with and without
// WithCoalescing, cells run in turn in the same rounds.
func coalescedReport(w io.Writer, o adaptersOptions, res, coalesced map[string][]adapterCell) {
	pool := "pool"
	if o.conns > 0 {
		pool = fmt.Sprintf("pool of %d connections (per message and coalesced alike, so that they share one connection budget)", o.conns)
	}
	fmt.Fprintf(w, "### The adapters, coalesced\n\nEach consumer again, in the same rounds right after its own cell, per message and on a Middleware "+
		"`WithCoalescing(Coalescing{Max: %d, Wait: time.Millisecond})`, with the same %d workers, %s, messages and effect; "+
		"×per message is the ratio of the two medians.\n\n", o.coalesce, o.workers, pool)
	fmt.Fprintln(w, "| consumer | per message, median msgs/s | coalesced, msgs/s by round | median | ×per message | target ≥ 1.5× |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---|")
	for _, name := range o.only {
		var rs []string
		for _, c := range coalesced[name] {
			rs = append(rs, thousands(int(c.rate+0.5)))
		}
		per, co := medianRate(res[name]), medianRate(coalesced[name])
		r := 0.0
		if per > 0 {
			r = co / per
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f | %s |\n", name, thousands(int(per+0.5)), joinComma(rs), thousands(int(co+0.5)), r, met(r >= 1.5))
	}
	fmt.Fprintln(w)
}

// adaptersReport writes the -adapters section.
func adaptersReport(w io.Writer, o adaptersOptions, server string, args []string, started time.Time, took time.Duration,
	res map[string][]adapterCell, h2h map[string][]float64) {
	fmt.Fprintf(w, "## Adapters' per-message consumers against ProcessMessage\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; lib/pq, a pool of %d connections; %d round%s, each running every consumer in turn (starting from another one each round) "+
		"on %s messages published beforehand, %d workers each. Each message: the loyalty effect (`UPDATE balances …`, `INSERT INTO point_ledger …`, "+
		"100,000 customers) in the claim's transaction, one transaction per message. A consumer's rate is the messages applied from its first "+
		"applied message to its last, over that time; ×process in turn is its median over the baseline's. After each consumer's cell, "+
		"a head-to-head cell runs it and the baseline at the same time, each on messages and workers of its own, so that both see the "+
		"same machine, and takes the ratio of the messages each applied while both ran (from the moment both had applied a tenth of "+
		"theirs to the moment either had applied nine tenths): the comparison on a shared machine, and the one the target reads.\n\n",
		runLine(started, took, server), 2*o.workers+4, o.rounds, plural(o.rounds), thousands(o.messages), o.workers)
	fmt.Fprintln(w, "| consumer | msgs/s by round | median msgs/s | ×process in turn | ×process head to head, by round | median |")
	fmt.Fprintln(w, "|---|---|---:|---:|---|---:|")
	base := medianRate(res["process"])
	for _, name := range o.only {
		var rs []string
		for _, c := range res[name] {
			rs = append(rs, thousands(int(c.rate+0.5)))
		}
		m := medianRate(res[name])
		ratio := "—"
		if base > 0 {
			ratio = fmt.Sprintf("%.2f", m/base)
		}
		hs, hm := "—", "—"
		if len(h2h[name]) > 0 {
			var fs []string
			for _, r := range h2h[name] {
				fs = append(fs, fmt.Sprintf("%.3f", r))
			}
			hs, hm = joinComma(fs), fmt.Sprintf("**%.3f**", median(h2h[name]))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", adapterLabels[name], joinComma(rs), thousands(int(m+0.5)), ratio, hs, hm)
	}
	fmt.Fprintln(w)
	if slices.ContainsFunc(o.only, func(n string) bool { return n != "process" }) {
		fmt.Fprintln(w, "| target | measured (median, head to head) | met |")
		fmt.Fprintln(w, "|---|---:|---|")
		for _, name := range o.only {
			if name == "process" {
				continue
			}
			if len(h2h[name]) == 0 {
				fmt.Fprintf(w, "| %s per message ≥ 0.8× ProcessMessage, %d workers | — | not measured: the two runs never overlapped |\n", name, o.workers)
				continue
			}
			r := median(h2h[name])
			fmt.Fprintf(w, "| %s per message ≥ 0.8× ProcessMessage, %d workers | %.3f | %s |\n", name, o.workers, r, met(r >= 0.8))
		}
		fmt.Fprintln(w)
	}
}

func medianRate(cs []adapterCell) float64 {
	var rs []float64
	for _, c := range cs {
		rs = append(rs, c.rate)
	}
	if len(rs) == 0 {
		return 0
	}
	return median(rs)
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

// orders returns the cell's messages: new order ids, random customers.
func (ab *adapterBench) orders(cell int64) []benchOrder {
	var ids atomic.Int64
	ids.Store(cell * 10_000_000)
	g := loyaltyload.NewGen(ab.schema, &ids, uint64(cell))
	out := make([]benchOrder, ab.o.messages)
	for i := range out {
		m := g.Next()
		out[i] = benchOrder{OrderID: m.OrderID, CustomerID: m.CustomerID, Points: m.Points}
	}
	return out
}

func (o benchOrder) key() string { return "order-completed:" + strconv.FormatInt(o.OrderID, 10) }

// credit is the loyalty effect of one order, through tx.
func (ab *adapterBench) credit(ctx context.Context, tx *sql.Tx, o benchOrder) error {
	if _, err := tx.ExecContext(ctx, ab.update, o.Points, o.CustomerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, ab.ledger, o.CustomerID, o.OrderID, o.Points)
	return err
}

// stopwatch counts applied messages from the observer's events: the time
// of the first and of the last, and done closed at the n-th.
type stopwatch struct {
	n           int64
	count       atomic.Int64
	mu          sync.Mutex
	first, last time.Time
	times       []time.Time // of every applied message
	done        chan struct{}
	failed      atomic.Pointer[error]
}

func newStopwatch(n int) *stopwatch { return &stopwatch{n: int64(n), done: make(chan struct{})} }

func (s *stopwatch) applied() {
	now := time.Now()
	k := s.count.Add(1)
	s.mu.Lock()
	if s.first.IsZero() {
		s.first = now
	}
	if now.After(s.last) {
		s.last = now
	}
	s.times = append(s.times, now)
	s.mu.Unlock()
	if k == s.n {
		close(s.done)
	}
}

// Observe is the consumers' observer: an applied message counts, and the
// first failure is kept.
func (s *stopwatch) Observe(_ context.Context, e adapter.Event) {
	switch e.Type {
	case adapter.EventApplied:
		s.applied()
	case adapter.EventDeadLettered, adapter.EventRequeued, adapter.EventSettleFailed, adapter.EventDuplicate:
		err := fmt.Errorf("unexpected %v: %v", e.Type, e.Err)
		s.failed.CompareAndSwap(nil, &err)
	}
}

// wait waits for the n-th message, a failure, or a minute, and returns the
// cell's figures.
func (s *stopwatch) wait(ctx context.Context, runErr <-chan error) adapterCell {
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-s.done:
	case err := <-runErr:
		return adapterCell{err: fmt.Errorf("run ended early: %w", err)}
	case <-t.C:
		return adapterCell{err: fmt.Errorf("%d of %d applied after a minute", s.count.Load(), s.n)}
	case <-ctx.Done():
		return adapterCell{err: ctx.Err()}
	}
	if p := s.failed.Load(); p != nil {
		return adapterCell{err: *p}
	}
	d := s.last.Sub(s.first)
	return adapterCell{elapsed: d, rate: float64(s.n-1) / d.Seconds()}
}

// measure runs one cell of the named consumer on db, on a coalescing
// Middleware when coalesced is set.
func (ab *adapterBench) measure(ctx context.Context, name string, coalesced bool, db *sql.DB) adapterCell {
	cell := ab.cell.Add(1)
	orders := ab.orders(cell)
	consumer := fmt.Sprintf("bench-%s-%d", name, cell)
	opts := []idempotent.Option{idempotent.WithTable(ab.table)}
	if coalesced {
		opts = append(opts, idempotent.WithCoalescing(idempotent.Coalescing{Max: ab.o.coalesce, Wait: time.Millisecond}))
	}
	mw, err := idempotent.New(db, postgres.New(), consumer, opts...)
	if err != nil {
		return adapterCell{err: err}
	}
	sw := newStopwatch(len(orders))
	inTurn := func(run func(context.Context) error) adapterCell {
		return runAll(ctx, []*stopwatch{sw}, []func(context.Context) error{run})[0]
	}
	if name == "process" {
		return inTurn(ab.process(mw, orders, sw))
	}
	return ab.consume(ctx, name, mw, orders, sw, consumer, inTurn)
}

// consume runs the named adapter's consumer with rn.
func (ab *adapterBench) consume(ctx context.Context, name string, mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch, consumer string, rn runner) adapterCell {
	switch name {
	case "nats":
		return ab.nats(ctx, mw, orders, sw, consumer, rn)
	case "rabbitmq":
		return ab.rabbitmq(ctx, mw, orders, sw, consumer, rn)
	case "kafka":
		return ab.kafka(ctx, mw, orders, sw, consumer, rn)
	case "redisstream":
		return ab.redisstream(ctx, mw, orders, sw, consumer, rn)
	}
	return adapterCell{err: fmt.Errorf("unknown consumer %q", name)}
}

// headToHead runs the named adapter's consumer and the baseline at the
// same time, each with the workers and messages of its own, and returns
// the ratio of the messages each applied while both ran: from the moment
// both had applied a tenth of theirs to the moment either had applied nine
// tenths.
func (ab *adapterBench) headToHead(ctx context.Context, name string) (float64, error) {
	cell := ab.cell.Add(1)
	consumer := fmt.Sprintf("bench-h2h-%s-%d", name, cell)
	mw, err := idempotent.New(ab.db, postgres.New(), consumer, idempotent.WithTable(ab.table))
	if err != nil {
		return 0, err
	}
	base, err := idempotent.New(ab.db, postgres.New(), consumer+"-process", idempotent.WithTable(ab.table))
	if err != nil {
		return 0, err
	}
	orders, baseOrders := ab.orders(cell), ab.orders(-cell)
	sw, bsw := newStopwatch(len(orders)), newStopwatch(len(baseOrders))
	var ratio float64
	c := ab.consume(ctx, name, mw, orders, sw, consumer, func(run func(context.Context) error) adapterCell {
		cells := runAll(ctx, []*stopwatch{sw, bsw}, []func(context.Context) error{run, ab.process(base, baseOrders, bsw)})
		for _, c := range cells {
			if c.err != nil {
				return c
			}
		}
		var err error
		ratio, err = overlapRatio(sw.times, bsw.times)
		return adapterCell{err: err}
	})
	return ratio, c.err
}

// errNoOverlap is a head-to-head round whose two runs did not run at the
// same time.
var errNoOverlap = errors.New("head to head: the two did not run at the same time")

// overlapRatio returns how many of a's times over how many of b's fall in
// the window from the later of their tenth times to the earlier of their
// nine-tenth ones.
func overlapRatio(a, b []time.Time) (float64, error) {
	slices.SortFunc(a, time.Time.Compare)
	slices.SortFunc(b, time.Time.Compare)
	lo := a[len(a)/10]
	if t := b[len(b)/10]; t.After(lo) {
		lo = t
	}
	hi := a[len(a)*9/10]
	if t := b[len(b)*9/10]; t.Before(hi) {
		hi = t
	}
	if !hi.After(lo) {
		return 0, errNoOverlap
	}
	in := func(ts []time.Time) int {
		n := 0
		for _, t := range ts {
			if t.After(lo) && !t.After(hi) {
				n++
			}
		}
		return n
	}
	na, nb := in(a), in(b)
	if nb == 0 {
		// As good as no overlap: a loaded machine ran the baseline's
		// applies before or after the other's, none between.
		return 0, fmt.Errorf("%w: the baseline applied nothing while both ran", errNoOverlap)
	}
	return float64(na) / float64(nb), nil
}

// process is the baseline's run: workers goroutines calling
// ProcessMessage on the orders, each taking the next; it returns once ctx
// ends, or at the first failure.
func (ab *adapterBench) process(mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch) func(context.Context) error {
	return func(ctx context.Context) error {
		var next atomic.Int64
		var wg sync.WaitGroup
		failed := make(chan error, ab.o.workers)
		for range ab.o.workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(orders) {
						return
					}
					o := orders[i]
					out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: o.key()}, func(ctx context.Context, tx *sql.Tx) error {
						return ab.credit(ctx, tx, o)
					})
					if err != nil || out != idempotent.Applied {
						failed <- fmt.Errorf("order %d: %v, %w", o.OrderID, out, err)
						return
					}
					sw.applied()
				}
			})
		}
		wg.Wait()
		select {
		case err := <-failed:
			return err
		default:
		}
		<-ctx.Done()
		return nil
	}
}

func decodeOrder(payload []byte) (benchOrder, error) {
	var o benchOrder
	err := json.Unmarshal(payload, &o)
	return o, err
}

// nats publishes the orders to a stream of the cell's own, then consumes
// them with a per-message nats.Consumer.
func (ab *adapterBench) nats(ctx context.Context, mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch, name string, rn runner) adapterCell {
	nc, err := natsgo.Connect(ab.o.natsURL)
	if err != nil {
		return adapterCell{err: err}
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return adapterCell{err: err}
	}
	stream := "BENCH_" + ab.tag + "_" + strconv.FormatInt(ab.cell.Load(), 10)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Storage: jetstream.FileStorage})
	if err != nil {
		return adapterCell{err: err}
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	var acks []jetstream.PubAckFuture
	for _, o := range orders {
		data, _ := json.Marshal(o)
		m := &natsgo.Msg{Subject: stream + ".orders", Data: data, Header: natsgo.Header{}}
		m.Header.Set(natsgo.MsgIdHdr, o.key())
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return adapterCell{err: err}
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return adapterCell{err: err}
		}
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxAckPending: 10000})
	if err != nil {
		return adapterCell{err: err}
	}
	c, err := idnats.NewConsumer(mw, idnats.Decode(decodeOrder, func(ctx context.Context, tx *sql.Tx, o benchOrder, _ jetstream.Msg) error {
		return ab.credit(ctx, tx, o)
	}), idnats.WithWorkers(ab.o.workers), idnats.WithObserver(sw), idnats.WithoutEventTime())
	if err != nil {
		return adapterCell{err: err}
	}
	return rn(func(ctx context.Context) error { return c.Run(ctx, cons) })
}

// runner runs a consumer's Run (or the baseline's) until its stopwatch
// has seen every message, and returns the cell.
type runner func(run func(context.Context) error) adapterCell

// runAll starts runs[i] for each stopwatch sws[i] at once, waits until
// every stopwatch has seen all its messages, then stops them all.
func runAll(ctx context.Context, sws []*stopwatch, runs []func(context.Context) error) []adapterCell {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]chan error, len(runs))
	for i, run := range runs {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- run(rctx) }()
	}
	cells := make([]adapterCell, len(runs))
	ended := make([]bool, len(runs))
	for i, sw := range sws {
		cells[i] = sw.wait(ctx, errs[i])
		ended[i] = cells[i].err != nil && strings.HasPrefix(cells[i].err.Error(), "run ended early")
	}
	cancel()
	for i := range runs {
		if ended[i] {
			continue
		}
		if err := <-errs[i]; err != nil && cells[i].err == nil {
			cells[i].err = err
		}
	}
	return cells
}

// rabbitmq publishes the orders to a queue of the cell's own, then
// consumes them with a per-message rabbitmq.Consumer.
func (ab *adapterBench) rabbitmq(ctx context.Context, mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch, name string, rn runner) adapterCell {
	conn, err := amqp.Dial(ab.o.amqpURL)
	if err != nil {
		return adapterCell{err: err}
	}
	defer conn.Close()
	pub, err := conn.Channel()
	if err != nil {
		return adapterCell{err: err}
	}
	queue := "bench." + ab.tag + "." + name
	if _, err := pub.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return adapterCell{err: err}
	}
	defer func() { _, _ = pub.QueueDelete(queue, false, false, false) }()
	if err := pub.Confirm(false); err != nil {
		return adapterCell{err: err}
	}
	var confs []*amqp.DeferredConfirmation
	for _, o := range orders {
		data, _ := json.Marshal(o)
		dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{MessageId: o.key(), DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: data})
		if err != nil {
			return adapterCell{err: err}
		}
		confs = append(confs, dc)
	}
	for _, dc := range confs {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return adapterCell{err: fmt.Errorf("publish not confirmed: %v", err)}
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return adapterCell{err: err}
	}
	defer ch.Close()
	c, err := rabbitmq.NewConsumer(mw, rabbitmq.Decode(decodeOrder, func(ctx context.Context, tx *sql.Tx, o benchOrder, _ *amqp.Delivery) error {
		return ab.credit(ctx, tx, o)
	}), rabbitmq.WithWorkers(ab.o.workers), rabbitmq.WithObserver(sw), rabbitmq.WithoutEventTime())
	if err != nil {
		return adapterCell{err: err}
	}
	return rn(func(ctx context.Context) error { return c.Run(ctx, ch, queue) })
}

// kafkaPartitions is how many partitions the -adapters topic has.
const kafkaPartitions = 8

// kafka produces the orders to a topic of an in-process kfake cluster,
// round its partitions, then consumes them with a per-record
// kafka.Consumer.
func (ab *adapterBench) kafka(ctx context.Context, mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch, name string, rn runner) adapterCell {
	topic := "bench-" + name
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return adapterCell{err: err}
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return adapterCell{err: err}
	}
	var recs []*kgo.Record
	for i, o := range orders {
		data, _ := json.Marshal(o)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % kafkaPartitions), Value: data,
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(o.key())}}})
	}
	err = prod.ProduceSync(ctx, recs...).FirstErr()
	prod.Close()
	if err != nil {
		return adapterCell{err: err}
	}
	c, err := kafka.NewConsumer(mw, kafka.Decode(decodeOrder, func(ctx context.Context, tx *sql.Tx, o benchOrder, _ *kgo.Record) error {
		return ab.credit(ctx, tx, o)
	}), kafka.WithWorkers(ab.o.workers), kafka.WithObserver(sw), kafka.WithoutEventTime(),
		kafka.WithOffsetsTable(ab.schema.Name+".kafka_offsets"))
	if err != nil {
		return adapterCell{err: err}
	}
	return rn(func(ctx context.Context) error {
		return c.Run(ctx, kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(name), kgo.ConsumeTopics(topic),
			kgo.FetchMaxWait(20*time.Millisecond))
	})
}

// parseAdapters checks the -adapters flags.
func parseAdapters(workers, messages, coalesce, conns int, only string, rounds int) (*adaptersOptions, error) {
	if workers < 1 || workers > 64 {
		return nil, fmt.Errorf("-adapters-workers: %d is not a number from 1 to 64", workers)
	}
	if coalesce != 0 && (coalesce < 2 || coalesce > 64) {
		return nil, fmt.Errorf("-adapters-coalesce: %d is not 0 (off) or a group size from 2 to 64", coalesce)
	}
	if messages < 10 {
		return nil, fmt.Errorf("-adapters-messages: %d is fewer than 10", messages)
	}
	if conns != 0 && (coalesce == 0 || conns < 1 || conns > 64) {
		return nil, fmt.Errorf("-adapters-conns: %d: give a pool of 1 to 64 connections, with -adapters-coalesce", conns)
	}
	o := &adaptersOptions{workers: workers, messages: messages, coalesce: coalesce, conns: conns, rounds: rounds, natsURL: localNATS, amqpURL: localAMQP}
	if u := os.Getenv("IDEMPOTENT_NATS_URL"); u != "" {
		o.natsURL = u
	}
	if u := os.Getenv("IDEMPOTENT_AMQP_URL"); u != "" {
		o.amqpURL = u
	}
	o.redisURL = localRedis
	if u := os.Getenv("IDEMPOTENT_REDIS_URL"); u != "" {
		o.redisURL = u
	}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(adapterNames, s) {
			return nil, fmt.Errorf("-adapters-consumers: unknown consumer %q (known: %s)", s, strings.Join(adapterNames, ", "))
		}
		if !slices.Contains(o.only, s) {
			o.only = append(o.only, s)
		}
	}
	return o, nil
}

// redisstream adds the orders to a stream of the cell's own, then consumes
// them with a per-message redisstream.Consumer in a group of its own.
func (ab *adapterBench) redisstream(ctx context.Context, mw *idempotent.Middleware, orders []benchOrder, sw *stopwatch, name string, rn runner) adapterCell {
	opt, err := redis.ParseURL(ab.o.redisURL)
	if err != nil {
		return adapterCell{err: err}
	}
	opt.PoolSize = ab.o.workers + 4
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	stream := "bench:" + ab.tag + ":" + name
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()
	pipe := rdb.Pipeline()
	for _, o := range orders {
		data, _ := json.Marshal(o)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{redisstream.DefaultKeyField: o.key(), redisstream.PayloadField: string(data)}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return adapterCell{err: err}
	}
	c, err := redisstream.NewConsumer(mw, redisstream.Decode(decodeOrder, func(ctx context.Context, tx *sql.Tx, o benchOrder, _ *redisstream.Delivery) error {
		return ab.credit(ctx, tx, o)
	}), redisstream.WithWorkers(ab.o.workers), redisstream.WithObserver(sw), redisstream.WithoutEventTime())
	if err != nil {
		return adapterCell{err: err}
	}
	return rn(func(ctx context.Context) error { return c.Run(ctx, rdb, stream, name) })
}
