package kafkatests

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// BenchmarkConsumers consumes the same topic (6 partitions, distinct keys)
// three ways, one worker each:
//
//   - handwritten: a franz-go poll loop that runs each record through
//     Middleware.Process (claim + effect, one transaction) and commits the
//     poll's offsets to Kafka after;
//   - record: kafka.NewConsumer, one transaction per record with the
//     offset advance in it;
//   - batch: kafka.NewBatchConsumer, one transaction per poll and partition
//     (up to 100 records: WithMaxPollRecords(600) over 6 partitions).
//
// Each round runs the three in turn (1,000 records each) and then a
// head-to-head cell: handwritten and record on the same topic at the same
// time, each in its own group, so that both see the same machine; the ratio
// of the records each applied while both ran is record/handwritten with the
// noise of a shared machine cancelled. It reports the rates in turn, the
// head-to-head ratio and batch/record. Run it with -benchtime=1x.
func BenchmarkConsumers(b *testing.B) {
	const records, rounds = 1000, 3
	db := openDB(b, 8)
	s := schema(b, db)
	cluster := newCluster(b, 6, "bench")
	prod := producer(b, cluster)
	for i := 0; i < records; i += 500 {
		var batch []*kgo.Record
		for j := i; j < i+500 && j < records; j++ {
			batch = append(batch, &kgo.Record{Topic: "bench", Partition: int32(j % 6), Value: fmt.Appendf(nil, "%d", j),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "k-%d", j)}}})
		}
		if err := prod.ProduceSync(context.Background(), batch...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	run := 0
	opts := func(group string) []kgo.Opt {
		return []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("bench"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20 * time.Millisecond)}
	}
	insert := `INSERT INTO ` + s + `.ledger (id, account, amount, member) VALUES ($1, 'a', 1, $2)`
	newMW := func(name string) *idempotent.Middleware {
		mw, err := idempotent.New(db, postgres.New(), name, idempotent.WithTable(s+".processed_messages"))
		if err != nil {
			b.Fatal(err)
		}
		return mw
	}
	if err := newMW("setup").EnsureSchema(context.Background()); err != nil {
		b.Fatal(err)
	}

	ours := func(batch bool, done *atomic.Int64) time.Duration {
		run++
		name := fmt.Sprintf("bench-%d", run)
		mw := newMW(name)
		finished := make(chan struct{})
		obs := kafka.ObserverFunc(func(_ context.Context, e kafka.Event) {
			if e.Type == kafka.EventApplied && done.Add(1) == records {
				close(finished)
			}
		})
		kopts := []kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithObserver(obs), kafka.WithWorkers(1), kafka.WithMaxPollRecords(600)}
		var c *kafka.Consumer
		var err error
		if batch {
			c, err = kafka.NewBatchConsumer(db, mw, nil, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
				ids := make([]string, len(rs))
				for i, r := range rs {
					ids[i] = string(r.Value)
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO `+s+`.ledger (id, account, amount, member) SELECT unnest($1::text[]), 'a', 1, $2`, pq.Array(ids), name)
				return err
			}, kopts...)
		} else {
			c, err = kafka.NewConsumer(db, mw, nil, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
				_, err := tx.ExecContext(ctx, insert, string(r.Value), name)
				return err
			}, kopts...)
		}
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		m := startMember(c, name, opts(name)...)
		<-finished
		d := time.Since(start)
		m.stop(b)
		return d
	}
	handwritten := func(done *atomic.Int64) time.Duration {
		run++
		name := fmt.Sprintf("bench-%d", run)
		mw := newMW(name)
		cl, err := kgo.NewClient(append(opts(name), kgo.DisableAutoCommit())...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		start := time.Now()
		n := 0
		for n < records {
			fetches := cl.PollRecords(ctx, 600)
			if err := fetches.Err0(); err != nil {
				b.Fatal(err)
			}
			var polled []*kgo.Record
			fetches.EachRecord(func(r *kgo.Record) {
				key := string(r.Headers[0].Value)
				for {
					_, err := mw.Process(ctx, key, func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, insert, string(r.Value), name)
						return err
					})
					if err == nil {
						break
					}
				}
				n++
				done.Add(1)
				polled = append(polled, r)
			})
			cl.CommitRecords(ctx, polled...)
		}
		return time.Since(start)
	}

	// headToHead runs handwritten and record at once and returns how many
	// records each applied between the first 100 and the moment either
	// reached 900.
	headToHead := func() (hwN, recN int64) {
		var a, c atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() { handwritten(&a) })
		wg.Go(func() { ours(false, &c) })
		snap := func(cond func() bool) (int64, int64) {
			for !cond() {
				time.Sleep(time.Millisecond) // sampling interval of a measurement
			}
			return a.Load(), c.Load()
		}
		a0, c0 := snap(func() bool { return a.Load() >= 100 && c.Load() >= 100 })
		a1, c1 := snap(func() bool { return a.Load() >= 900 || c.Load() >= 900 })
		wg.Wait()
		return a1 - a0, c1 - c0
	}

	for range b.N {
		var hw, rec, bat time.Duration
		var hwN, recN int64
		for range rounds {
			hw += handwritten(new(atomic.Int64))
			rec += ours(false, new(atomic.Int64))
			bat += ours(true, new(atomic.Int64))
			h, r := headToHead()
			hwN, recN = hwN+h, recN+r
		}
		rate := func(d time.Duration) float64 { return float64(records*rounds) / d.Seconds() }
		b.ReportMetric(rate(hw), "handwritten-msgs/s")
		b.ReportMetric(rate(rec), "record-msgs/s")
		b.ReportMetric(rate(bat), "batch-msgs/s")
		b.ReportMetric(rate(rec)/rate(hw), "record/handwritten")
		b.ReportMetric(float64(recN)/float64(hwN), "record/handwritten-h2h")
		b.ReportMetric(rate(bat)/rate(rec), "batch/record")
	}
}
