// Package kafkabench measures the kafka package's consumers against a
// hand-written franz-go consumer, on an in-process Kafka cluster (franz-go's
// kfake, which speaks the real protocol, group coordination included) and a
// real PostgreSQL. The kafka tests' BenchmarkConsumers and the bench
// command's -kafka mode both run it.
//
// It consumes the same topic (6 partitions, distinct keys) three ways, one
// worker each:
//
//   - handwritten: a franz-go poll loop that runs each record through
//     Middleware.Process (claim + effect, one transaction) and commits the
//     poll's offsets to Kafka after;
//   - record: kafka.NewConsumer, one transaction per record with the
//     offset advance in it;
//   - batch: kafka.NewBatchConsumer, one transaction per poll and partition
//     (up to 100 records: WithMaxPollRecords(600) over 6 partitions).
//
// Each round runs the three in turn (every one consumes the whole topic,
// each in a consumer group and under a consumer name of its own) and then
// a head-to-head cell: handwritten and record on the same topic at the same
// time, each in its own group, so that both see the same machine; the ratio
// of the records each applied while both ran is record/handwritten with the
// noise of a shared machine cancelled.
package kafkabench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// Partitions is the number of partitions of the topic consumed.
const Partitions = 6

// pollRecords is the records a poll may return: about 100 per partition,
// the batch consumer's batch.
const pollRecords = 600

// Config is what Run measures.
type Config struct {
	// DSN is the PostgreSQL database (lib/pq); the run works in a schema
	// of its own, dropped at the end.
	DSN string
	// Records is how many records the topic holds: each consumer consumes
	// them all, in every cell. 1,000 when zero.
	Records int
	// Rounds is the number of rounds. 3 when zero.
	Rounds int
	// Log, when set, receives a line per cell as the run goes.
	Log io.Writer
}

// Round is what one round measured.
type Round struct {
	// Handwritten, Record and Batch are the time each consumer took to
	// consume the topic, in turn.
	Handwritten, Record, Batch time.Duration
	// H2HHandwritten and H2HRecord are the records each applied in the
	// head-to-head cell between the moment both had applied a tenth of the
	// topic and the moment either had applied nine tenths.
	H2HHandwritten, H2HRecord int64
	// Records is the records each consumer consumed in turn.
	Records int
}

func (r Round) rate(d time.Duration) float64 { return float64(r.Records) / d.Seconds() }

// HandwrittenRate is the hand-written consumer's rate in turn, msgs/s.
func (r Round) HandwrittenRate() float64 { return r.rate(r.Handwritten) }

// RecordRate is the per-record consumer's rate in turn, msgs/s.
func (r Round) RecordRate() float64 { return r.rate(r.Record) }

// BatchRate is the batch consumer's rate in turn, msgs/s.
func (r Round) BatchRate() float64 { return r.rate(r.Batch) }

// RecordPerHandwritten is the per-record consumer's rate in turn over the
// hand-written one's.
func (r Round) RecordPerHandwritten() float64 { return r.RecordRate() / r.HandwrittenRate() }

// RecordPerHandwrittenH2H is the head-to-head ratio: records the per-record
// consumer applied over records the hand-written one applied, at the same
// time.
func (r Round) RecordPerHandwrittenH2H() float64 {
	return float64(r.H2HRecord) / float64(r.H2HHandwritten)
}

// BatchPerRecord is the batch consumer's rate in turn over the per-record
// consumer's.
func (r Round) BatchPerRecord() float64 { return r.BatchRate() / r.RecordRate() }

// Result is what Run measured.
type Result struct {
	// Records is the records per cell and consumer.
	Records int
	// Rounds holds every round's figures, in order.
	Rounds []Round
}

// total adds up a figure over the rounds.
func (res *Result) total(f func(Round) time.Duration) time.Duration {
	var d time.Duration
	for _, r := range res.Rounds {
		d += f(r)
	}
	return d
}

func (res *Result) rate(d time.Duration) float64 {
	return float64(res.Records*len(res.Rounds)) / d.Seconds()
}

// HandwrittenRate is the hand-written consumer's rate in turn over all
// rounds, msgs/s.
func (res *Result) HandwrittenRate() float64 {
	return res.rate(res.total(func(r Round) time.Duration { return r.Handwritten }))
}

// RecordRate is the per-record consumer's rate in turn over all rounds,
// msgs/s.
func (res *Result) RecordRate() float64 {
	return res.rate(res.total(func(r Round) time.Duration { return r.Record }))
}

// BatchRate is the batch consumer's rate in turn over all rounds, msgs/s.
func (res *Result) BatchRate() float64 {
	return res.rate(res.total(func(r Round) time.Duration { return r.Batch }))
}

// RecordPerHandwritten is RecordRate over HandwrittenRate.
func (res *Result) RecordPerHandwritten() float64 { return res.RecordRate() / res.HandwrittenRate() }

// BatchPerRecord is BatchRate over RecordRate.
func (res *Result) BatchPerRecord() float64 { return res.BatchRate() / res.RecordRate() }

// RecordPerHandwrittenH2H is the head-to-head ratio over all rounds: the
// records the per-record consumer applied over those the hand-written one
// applied while both ran.
func (res *Result) RecordPerHandwrittenH2H() float64 {
	var h, r int64
	for _, x := range res.Rounds {
		h, r = h+x.H2HHandwritten, r+x.H2HRecord
	}
	return float64(r) / float64(h)
}

// Run sets up a schema, a kfake cluster with a topic of Partitions
// partitions holding cfg.Records records, and measures the three consumers
// for cfg.Rounds rounds.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	if cfg.Records == 0 {
		cfg.Records = 1000
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 3
	}
	if cfg.Records < 10 || cfg.Rounds < 1 {
		return nil, fmt.Errorf("kafkabench: %d records and %d rounds: want at least 10 records and 1 round", cfg.Records, cfg.Rounds)
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	db, err := sql.Open("postgres", cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("kafkabench: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	s, drop, err := setupSchema(ctx, db)
	if err != nil {
		return nil, err
	}
	defer func() {
		if e := drop(); e != nil {
			err = errors.Join(err, e)
		}
	}()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(Partitions, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("kafkabench: start kfake: %w", err)
	}
	defer cluster.Close()
	if err := produce(ctx, cluster, cfg.Records); err != nil {
		return nil, err
	}
	b := &bench{db: db, schema: s, seeds: cluster.ListenAddrs(), records: cfg.Records}
	if err := b.newMW("setup").EnsureSchema(ctx); err != nil {
		return nil, fmt.Errorf("kafkabench: claim table: %w", err)
	}
	res := &Result{Records: cfg.Records}
	for i := range cfg.Rounds {
		r := Round{Records: cfg.Records}
		if r.Handwritten, err = b.handwritten(ctx, nil); err != nil {
			return nil, err
		}
		if r.Record, err = b.ours(ctx, false, nil); err != nil {
			return nil, err
		}
		if r.Batch, err = b.ours(ctx, true, nil); err != nil {
			return nil, err
		}
		if r.H2HHandwritten, r.H2HRecord, err = b.headToHead(ctx); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Log, "kafka round %d/%d  handwritten %.0f, record %.0f, batch %.0f msgs/s; head to head record/handwritten %.3f\n",
			i+1, cfg.Rounds, r.HandwrittenRate(), r.RecordRate(), r.BatchRate(), r.RecordPerHandwrittenH2H())
		res.Rounds = append(res.Rounds, r)
	}
	return res, nil
}

const topic = "bench"

// setupSchema creates a schema of the run's own with the offsets and the
// ledger tables in it, and returns it with the function that drops it.
func setupSchema(ctx context.Context, db *sql.DB) (string, func() error, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	s := "kb_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+s); err != nil {
		return "", nil, fmt.Errorf("kafkabench: create schema: %w", err)
	}
	drop := func() error {
		if _, err := db.ExecContext(context.Background(), `DROP SCHEMA `+s+` CASCADE`); err != nil {
			return fmt.Errorf("kafkabench: drop schema %s: %w", s, err)
		}
		return nil
	}
	if err := kafka.EnsureSchema(ctx, db, s+".kafka_offsets"); err != nil {
		return "", nil, errors.Join(fmt.Errorf("kafkabench: offsets table: %w", err), drop())
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+s+`.ledger (id text NOT NULL, account text NOT NULL, amount bigint NOT NULL, member text NOT NULL)`); err != nil {
		return "", nil, errors.Join(fmt.Errorf("kafkabench: ledger table: %w", err), drop())
	}
	return s, drop, nil
}

// produce writes n records round the partitions, record j with the key
// header k-j and the value j.
func produce(ctx context.Context, c *kfake.Cluster, n int) error {
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("kafkabench: producer: %w", err)
	}
	defer prod.Close()
	for i := 0; i < n; i += 500 {
		var batch []*kgo.Record
		for j := i; j < i+500 && j < n; j++ {
			batch = append(batch, &kgo.Record{Topic: topic, Partition: int32(j % Partitions), Value: fmt.Appendf(nil, "%d", j),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "k-%d", j)}}})
		}
		if err := prod.ProduceSync(ctx, batch...).FirstErr(); err != nil {
			return fmt.Errorf("kafkabench: produce: %w", err)
		}
	}
	return nil
}

// bench is one run's database, schema and cluster.
type bench struct {
	db      *sql.DB
	schema  string
	seeds   []string
	records int
	run     atomic.Int64
}

// name returns a consumer name, and group, not used before in the run.
func (b *bench) name() string { return fmt.Sprintf("bench-%d", b.run.Add(1)) }

func (b *bench) opts(group string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(b.seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20 * time.Millisecond)}
}

func (b *bench) newMW(name string) *idempotent.Middleware {
	mw, err := idempotent.New(b.db, postgres.New(), name, idempotent.WithTable(b.schema+".processed_messages"))
	if err != nil {
		panic(err) // a fixed, valid configuration
	}
	return mw
}

func (b *bench) insertSQL() string {
	return `INSERT INTO ` + b.schema + `.ledger (id, account, amount, member) VALUES ($1, 'a', 1, $2)`
}

// ours consumes the topic with kafka.NewConsumer (or NewBatchConsumer) in a
// group of its own and returns the time it took; applied, when set, is
// called on every record applied.
func (b *bench) ours(ctx context.Context, batch bool, applied func()) (time.Duration, error) {
	name := b.name()
	mw := b.newMW(name)
	var done atomic.Int64
	finished := make(chan struct{})
	obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
		if e.Type != adapter.EventApplied {
			return
		}
		if applied != nil {
			applied()
		}
		if done.Add(1) == int64(b.records) {
			close(finished)
		}
	})
	kopts := []kafka.Option{kafka.WithOffsetsTable(b.schema + ".kafka_offsets"), kafka.WithObserver(obs), kafka.WithWorkers(1), kafka.WithMaxPollRecords(pollRecords)}
	var c *kafka.Consumer
	var err error
	if batch {
		c, err = kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			ids := make([]string, len(rs))
			for i, r := range rs {
				ids[i] = string(r.Value)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO `+b.schema+`.ledger (id, account, amount, member) SELECT unnest($1::text[]), 'a', 1, $2`, pq.Array(ids), name)
			return err
		}, kopts...)
	} else {
		insert := b.insertSQL()
		c, err = kafka.NewConsumer(mw, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
			_, err := tx.ExecContext(ctx, insert, string(r.Value), name)
			return err
		}, kopts...)
	}
	if err != nil {
		return 0, fmt.Errorf("kafkabench: %s: %w", name, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	start := time.Now()
	go func() { ran <- c.Run(runCtx, b.opts(name)...) }()
	select {
	case <-finished:
	case err := <-ran:
		return 0, fmt.Errorf("kafkabench: %s: Run returned before consuming the topic: %w", name, err)
	case <-ctx.Done():
		<-ran
		return 0, ctx.Err()
	}
	d := time.Since(start)
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			return 0, fmt.Errorf("kafkabench: %s: Run: %w", name, err)
		}
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("kafkabench: %s: Run did not return within a minute of its context ending", name)
	}
	return d, nil
}

// handwritten consumes the topic with a franz-go poll loop, Process per
// record and a Kafka offset commit after each poll, in a group of its own,
// and returns the time it took; applied, when set, is called on every
// record applied.
func (b *bench) handwritten(ctx context.Context, applied func()) (time.Duration, error) {
	name := b.name()
	mw := b.newMW(name)
	insert := b.insertSQL()
	cl, err := kgo.NewClient(append(b.opts(name), kgo.DisableAutoCommit())...)
	if err != nil {
		return 0, fmt.Errorf("kafkabench: %s: %w", name, err)
	}
	defer cl.Close()
	start := time.Now()
	n := 0
	for n < b.records {
		fetches := cl.PollRecords(ctx, pollRecords)
		if err := fetches.Err0(); err != nil {
			return 0, fmt.Errorf("kafkabench: %s: poll: %w", name, err)
		}
		var polled []*kgo.Record
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed != nil {
				return
			}
			key := string(r.Headers[0].Value)
			// A hand-written consumer retries a delivery that failed; the
			// benchmark's deliveries have no reason to fail, so a few
			// failures in a row end the run.
			for attempt := 1; ; attempt++ {
				_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, insert, string(r.Value), name)
					return err
				})
				if err == nil {
					break
				}
				if attempt == 5 || ctx.Err() != nil {
					failed = fmt.Errorf("kafkabench: %s: record %s: %w", name, key, err)
					return
				}
			}
			n++
			if applied != nil {
				applied()
			}
			polled = append(polled, r)
		})
		if failed != nil {
			return 0, failed
		}
		if err := cl.CommitRecords(ctx, polled...); err != nil {
			return 0, fmt.Errorf("kafkabench: %s: commit: %w", name, err)
		}
	}
	return time.Since(start), nil
}

// window counts the records two consumers apply and notes the counts when
// both have applied a tenth of the topic and when either has applied nine
// tenths.
type window struct {
	mu         sync.Mutex
	lo, hi     int64
	n          [2]int64
	start, end [2]int64
	phase      int
}

func (w *window) add(side int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n[side]++
	if w.phase == 0 && w.n[0] >= w.lo && w.n[1] >= w.lo {
		w.start, w.phase = w.n, 1
	}
	if w.phase == 1 && (w.n[0] >= w.hi || w.n[1] >= w.hi) {
		w.end, w.phase = w.n, 2
	}
}

// headToHead runs handwritten and record at once and returns how many
// records each applied between the moment both had applied a tenth of the
// topic and the moment either had applied nine tenths.
func (b *bench) headToHead(ctx context.Context) (hwN, recN int64, err error) {
	w := &window{lo: int64(b.records / 10), hi: int64(b.records * 9 / 10)}
	var wg sync.WaitGroup
	var errHW, errRec error
	wg.Go(func() { _, errHW = b.handwritten(ctx, func() { w.add(0) }) })
	wg.Go(func() { _, errRec = b.ours(ctx, false, func() { w.add(1) }) })
	wg.Wait()
	if err := errors.Join(errHW, errRec); err != nil {
		return 0, 0, err
	}
	if w.phase != 2 {
		return 0, 0, fmt.Errorf("kafkabench: head to head: the window never closed (applied %v)", w.n)
	}
	return w.end[0] - w.start[0], w.end[1] - w.start[1], nil
}
