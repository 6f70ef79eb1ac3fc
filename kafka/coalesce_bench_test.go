package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
)

// The workload of the coalescing benchmarks: 8 partitions of 500 records
// each (distinct keys), a payment effect on the partition's own account (so
// that transactions of different partitions never wait for one another's
// rows), 8 workers.
const benchParts, benchPerPart = 8, 500

// benchVariants are the Middleware configurations measured.
var benchVariants = []struct {
	name string
	opts []idempotent.Option
}{
	{"plain", nil},
	{"coalesced-8", []idempotent.Option{idempotent.WithCoalescing(idempotent.Coalescing{Max: 8, Wait: time.Millisecond})}},
	{"coalesced-4", []idempotent.Option{idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Millisecond})}},
	{"coalesced-4-savepoints", []idempotent.Option{idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Millisecond, Savepoints: true})}},
}

// benchEnv is the benchmarks' schema, cluster and producer.
type benchEnv struct {
	b       *testing.B
	db      *sql.DB
	s       string
	cluster *kfake.Cluster
	prod    *kgo.Client
	adm     *kgo.Client
}

func newBenchEnv(b *testing.B) *benchEnv {
	db := openDB(b, 4)
	s := schema(b, db)
	for p := range benchParts {
		if _, err := db.Exec(`INSERT INTO `+s+`.accounts (id) VALUES ($1)`, fmt.Sprintf("acct-%d", p)); err != nil {
			b.Fatal(err)
		}
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cluster.Close)
	adm, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(adm.Close)
	return &benchEnv{b: b, db: db, s: s, cluster: cluster, prod: producer(b, cluster), adm: adm}
}

// middleware returns a Middleware of variant opts on a pool of its own of
// pool connections, closed at the end of b (a sub-benchmark: the pools of
// the sub-benchmarks do not add up on the shared server).
func (e *benchEnv) middleware(b *testing.B, name string, pool int, opts []idempotent.Option) *idempotent.Middleware {
	pdb := openDB(b, pool)
	pdb.SetMaxIdleConns(pool)
	return newMiddleware(b, pdb, e.s, name, opts...)
}

// topic creates a topic of the workload and produces its records.
func (e *benchEnv) topic() string {
	topic := testenv.UniqueName("bench")
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, benchParts, 1
	req := kmsg.NewPtrCreateTopicsRequest()
	req.Topics = []kmsg.CreateTopicsRequestTopic{rt}
	resp, err := req.RequestWith(context.Background(), e.adm)
	if err != nil {
		e.b.Fatal(err)
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 {
			e.b.Fatalf("create topic %s: error code %d", t.Topic, t.ErrorCode)
		}
	}
	for p := range int32(benchParts) {
		recs := make([]*kgo.Record, benchPerPart)
		for i := range recs {
			id := fmt.Sprintf("%s-%d-%d", topic, p, i)
			val, _ := json.Marshal(payment{ID: id, Account: fmt.Sprintf("acct-%d", p), Amount: 1})
			recs[i] = &kgo.Record{Topic: topic, Partition: p, Value: val, Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}}
		}
		if err := e.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			e.b.Fatal(err)
		}
	}
	return topic
}

// run is one consumer of the workload: it counts the records it applied
// and closes done at the last.
type benchRun struct {
	applied atomic.Int64
	done    chan struct{}
	m       *member
}

// start starts a NewConsumer of mw on topic.
func (e *benchEnv) start(mw *idempotent.Middleware, topic string) *benchRun {
	r := &benchRun{done: make(chan struct{})}
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		return applyPayment(ctx, tx, e.s, "m", p)
	}), kafka.WithOffsetsTable(e.s+".kafka_offsets"), kafka.WithWorkers(benchParts),
		kafka.WithObserver(adapter.ObserverFunc(func(_ context.Context, ev adapter.Event) {
			if ev.Type == adapter.EventApplied && r.applied.Add(1) == benchParts*benchPerPart {
				close(r.done)
			}
		})))
	if err != nil {
		e.b.Fatal(err)
	}
	r.m = startMember(c, topic, kgo.SeedBrokers(e.cluster.ListenAddrs()...), kgo.ConsumerGroup(topic), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	return r
}

// transactions returns how many transactions applied topic's records.
func (e *benchEnv) transactions(topic string) int {
	var n int
	if err := e.db.QueryRow(`SELECT count(DISTINCT xmin::text) FROM `+e.s+`.ledger WHERE id LIKE $1`, topic+"-%").Scan(&n); err != nil {
		e.b.Fatal(err)
	}
	return n
}

// BenchmarkCoalescedRecords measures the per-record consumer (NewConsumer)
// with and without WithCoalescing on the workload, each variant with a
// pool of 16 connections and with one of 2 (fewer connections than
// workers). Each iteration consumes a fresh topic from its start and
// reports records/s from the consumer's start to its last record's commit,
// and records per transaction (not for savepoints: rows written under a
// savepoint carry its subtransaction's id):
//
//	go test -run '^$' -bench 'CoalescedRecords$' -benchtime 1x -count 3 ./kafka/
func BenchmarkCoalescedRecords(b *testing.B) {
	e := newBenchEnv(b)
	for _, pool := range []int{16, 2} {
		for _, v := range benchVariants {
			b.Run(fmt.Sprintf("pool-%d/%s", pool, v.name), func(b *testing.B) {
				mw := e.middleware(b, fmt.Sprintf("bench-%d-%s", pool, v.name), pool, v.opts)
				var total time.Duration
				var txs int
				for range b.N {
					b.StopTimer()
					topic := e.topic()
					b.StartTimer()
					start := time.Now()
					r := e.start(mw, topic)
					<-r.done
					total += time.Since(start)
					b.StopTimer()
					r.m.stop(b)
					txs += e.transactions(topic)
				}
				n := float64(b.N * benchParts * benchPerPart)
				b.ReportMetric(n/total.Seconds(), "records/s")
				if !strings.Contains(v.name, "savepoints") {
					b.ReportMetric(n/float64(txs), "records/tx")
				}
			})
		}
	}
}

// BenchmarkCoalescedRecordsHeadToHead runs the plain consumer and a
// coalescing one at the same time, each on a topic of the workload and a
// pool of its own, so that both see the same machine; when the first has
// applied its last record it reports, for each, the records applied so far
// per second, and their ratio (coalesced/plain), which cancels the drift of
// a shared machine that variants run in turn do not:
//
//	go test -run '^$' -bench 'CoalescedRecordsHeadToHead' -benchtime 1x -count 5 ./kafka/
func BenchmarkCoalescedRecordsHeadToHead(b *testing.B) {
	e := newBenchEnv(b)
	for _, pool := range []int{16, 2} {
		for _, v := range benchVariants[1:] {
			b.Run(fmt.Sprintf("pool-%d/plain-vs-%s", pool, v.name), func(b *testing.B) {
				plain := e.middleware(b, fmt.Sprintf("h2h-%d-plain-%s", pool, v.name), pool, nil)
				co := e.middleware(b, fmt.Sprintf("h2h-%d-%s", pool, v.name), pool, v.opts)
				var sumPlain, sumCo float64
				for range b.N {
					b.StopTimer()
					tp, tc := e.topic(), e.topic()
					b.StartTimer()
					start := time.Now()
					rp, rc := e.start(plain, tp), e.start(co, tc)
					select {
					case <-rp.done:
					case <-rc.done:
					}
					d := time.Since(start).Seconds()
					sumPlain += float64(rp.applied.Load()) / d
					sumCo += float64(rc.applied.Load()) / d
					b.StopTimer()
					<-rp.done
					<-rc.done
					rp.m.stop(b)
					rc.m.stop(b)
				}
				b.ReportMetric(sumPlain/float64(b.N), "plain-records/s")
				b.ReportMetric(sumCo/float64(b.N), "coalesced-records/s")
				b.ReportMetric(sumCo/sumPlain, "ratio")
			})
		}
	}
}
