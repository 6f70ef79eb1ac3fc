package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
)

// TestBrokertest runs the adapters' conformance suite on the kafka adapter:
// a kfake cluster of each scenario's own with a topic of four partitions,
// each key on one of them (so copies of a message are read in order, and
// the records of different keys coalesce in the coalesced modes), per
// record (NewConsumer) and in batches (NewBatchConsumer).
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, kafkaHarness{})
}

type kafkaHarness struct{}

// Features: a batch consumer (Batch); a member started after another
// stopped or was killed reads on from the offset stored in the database
// (Kill, Restart); poison goes to the dead-letter outbox (DeadLetter); a
// requeued record waits in place the settle rule's delay, which its
// EventRequeued reports (RequeueDelay); the harness sets the record
// timestamp (TransportTime).
//
// No LoseAck: the offset advances in the claim's own transaction, so there
// is no moment between the commit and the "ack" for a crash to fall in
// (the offset commit to Kafka is for lag tools only; skipping it
// redelivers nothing).
func (kafkaHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, DeadLetter: true, RequeueDelay: true, TransportTime: true, Ordered: true}
}

const brokertestTopic = "orders"

// brokertestPartitions is the topic's partition count.
const brokertestPartitions = 4

func (kafkaHarness) Open(t *testing.T) brokertest.Transport {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(brokertestPartitions, brokertestTopic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &kafkaTransport{t: t, cluster: c, prod: producer(t, c), group: testenv.UniqueName("brokertest")}
}

type kafkaTransport struct {
	t         *testing.T
	cluster   *kfake.Cluster
	prod      *kgo.Client
	group     string
	published [brokertestPartitions]atomic.Int64
	last      atomic.Int32 // the partition of the last record published
	// db and schema are the claim table's, where the offsets table and
	// the dead-letter outbox are: set by NewConsumer.
	mu     sync.Mutex
	db     *sql.DB
	schema string
}

// Publish produces m to its key's partition: the key as the record key
// and the default key header (idempotency-key), m.Headers as record
// headers, and m.TransportTime, when set, as the record timestamp.
func (tr *kafkaTransport) Publish(ctx context.Context, m brokertest.Message) error {
	h := fnv.New32a()
	_, _ = h.Write([]byte(m.Key))
	p := int32(h.Sum32() % brokertestPartitions)
	r := &kgo.Record{Topic: brokertestTopic, Partition: p, Key: []byte(m.Key), Value: m.Body, Timestamp: m.TransportTime}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.DefaultKeyHeader, Value: []byte(m.Key)})
	for k, v := range m.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if err := tr.prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		return err
	}
	tr.published[p].Add(1)
	tr.last.Store(p)
	return nil
}

// errKilled fails the transaction of a record in flight when its consumer
// is killed: a process that dies before its commit leaves nothing behind.
var errKilled = errors.New("brokertest harness: the consumer was killed before the commit")

// NewConsumer builds kafka.NewConsumer or kafka.NewBatchConsumer (the key
// in the default header) with the offsets table and the dead-letter outbox
// in the scenario's schema (the claim table's), and the suite's observer,
// which reads the settlements from the events.
func (tr *kafkaTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	db := cfg.DB
	schema, _, _ := strings.Cut(cfg.Middleware.Config().Table, ".")
	if err := kafka.EnsureSchema(context.Background(), db, schema+".kafka_offsets"); err != nil {
		tr.t.Fatal(err)
	}
	tr.mu.Lock()
	tr.db, tr.schema = db, schema
	tr.mu.Unlock()
	c := &kafkaConsumer{tr: tr, assigned: make(chan struct{})}
	opts := []kafka.Option{
		// A worker per partition at least: a record waiting in place
		// (dated ahead, within the bound) holds its partition only.
		kafka.WithWorkers(max(cfg.Workers, brokertestPartitions)), kafka.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond),
		kafka.WithOffsetsTable(schema + ".kafka_offsets"),
		kafka.WithDeadLetter(newOutbox(tr.t, db, schema, cfg.Middleware.Config().Consumer), "orders.dead"),
		kafka.WithObserver(adapter.ObserverFunc(func(ctx context.Context, e adapter.Event) {
			if d, ok := e.Detail.(kafka.Rebalance); ok && e.Type == adapter.EventAssigned && len(d.Partitions[brokertestTopic]) > 0 {
				c.once.Do(func() { close(c.assigned) })
			}
			cfg.Observer.Observe(ctx, e)
		})),
	}
	if cfg.NoEventTime {
		opts = append(opts, kafka.WithoutEventTime())
	}
	var err error
	if cfg.Batch {
		opts = append(opts, kafka.WithBatchSize(cfg.BatchSize))
		c.c, err = kafka.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			bodies := make([][]byte, len(rs))
			for i, r := range rs {
				bodies[i] = r.Value
			}
			return c.unlessKilled(cfg.BatchHandler(ctx, tx, bodies))
		}, opts...)
	} else {
		c.c, err = kafka.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
			return c.unlessKilled(cfg.Handler(ctx, tx, r.Value))
		}, opts...)
	}
	return c, err
}

// kafkaConsumer is one group member: a Run of its own.
type kafkaConsumer struct {
	tr       *kafkaTransport
	c        *kafka.Consumer
	once     sync.Once
	assigned chan struct{}
	killed   atomic.Bool
	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan error
}

func (c *kafkaConsumer) unlessKilled(err error) error {
	if c.killed.Load() {
		return errKilled
	}
	return err
}

// Start runs the member and returns once the group assigned it the
// partition.
func (c *kafkaConsumer) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	c.mu.Lock()
	c.cancel, c.done = cancel, done
	c.mu.Unlock()
	go func() {
		done <- c.c.Run(runCtx, kgo.SeedBrokers(c.tr.cluster.ListenAddrs()...), kgo.ConsumerGroup(c.tr.group),
			kgo.ConsumeTopics(brokertestTopic), kgo.FetchMaxWait(100*time.Millisecond))
	}()
	select {
	case <-c.assigned:
		return nil
	case err := <-done:
		done <- err
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop cancels Run, which lets transactions in flight commit, and waits
// for it.
func (c *kafkaConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		return nil
	}
	c.cancel()
	select {
	case err := <-c.done:
		c.done = nil
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill crashes the member without waiting: the transaction in flight fails
// instead of committing (errKilled), so its offset stays where it was, and
// the member leaves the group; the next member reads the record again from
// the stored offset.
func (c *kafkaConsumer) Kill() error {
	c.killed.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	return nil
}

// positions reads the stored offset of each partition (0 when none is
// stored) and the id of the transaction that wrote it.
func (tr *kafkaTransport) positions(ctx context.Context) (next [brokertestPartitions]int64, txid [brokertestPartitions]string, err error) {
	tr.mu.Lock()
	db, schema := tr.db, tr.schema
	tr.mu.Unlock()
	if db == nil {
		return next, txid, errors.New("brokertest harness: no consumer was built")
	}
	rows, err := db.QueryContext(ctx, `SELECT partition, next_offset, xmin::text FROM "`+schema+`".kafka_offsets WHERE topic = $1`, brokertestTopic)
	if err != nil {
		return next, txid, err
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var n int64
		var x string
		if err := rows.Scan(&p, &n, &x); err != nil {
			return next, txid, err
		}
		next[p], txid[p] = n, x
	}
	return next, txid, rows.Err()
}

// Unsettled counts the records past the offsets stored in the database:
// the one position the consumer resumes from.
func (tr *kafkaTransport) Unsettled(ctx context.Context) (int, error) {
	next, _, err := tr.positions(ctx)
	n := 0
	for p := range next {
		n += int(tr.published[p].Load() - next[p])
	}
	return n, err
}

// PositionTxid is the transaction id (xmin) of the stored offset's row of
// the partition last published to.
func (tr *kafkaTransport) PositionTxid(ctx context.Context) (string, error) {
	_, txid, err := tr.positions(ctx)
	return txid[tr.last.Load()], err
}

// DeadLetters reads the keys of the dead-letter outbox's records.
func (tr *kafkaTransport) DeadLetters(ctx context.Context) ([]string, error) {
	tr.mu.Lock()
	db, schema := tr.db, tr.schema
	tr.mu.Unlock()
	if db == nil {
		return nil, errors.New("brokertest harness: no consumer was built")
	}
	rows, err := db.QueryContext(ctx, `SELECT payload::text FROM "`+schema+`".outbox WHERE kind = $1 ORDER BY id`, kafka.DeadLetterKind)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var payload string
		if err := rows.Scan(&payload); err != nil {
			return nil, err
		}
		var dl kafka.DeadLetter
		if err := json.Unmarshal([]byte(payload), &dl); err != nil {
			return nil, err
		}
		keys = append(keys, string(dl.Key))
	}
	return keys, rows.Err()
}
