package kafkatests

import (
	"context"
	"database/sql"
	"errors"
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
// a kfake cluster of each scenario's own with a one-partition topic (so
// what a stopped or killed member leaves is read by the next in order),
// per record (NewConsumer) and in batches (NewBatchConsumer).
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, kafkaHarness{})
}

type kafkaHarness struct{}

// Features: a batch consumer (Batch); a member started after another
// stopped or was killed reads on from the offset stored in the database
// (Kill, Restart); poison goes to the dead-letter outbox (DeadLetter); the
// harness sets the record timestamp (TransportTime).
//
// No LoseAck: the offset advances in the claim's own transaction, so there
// is no moment between the commit and the "ack" for a crash to fall in
// (the offset commit to Kafka is for lag tools only; skipping it
// redelivers nothing). No RequeueDelay: a record dated ahead of the clock
// waits in place, looking again every WithRetryDelay max, and EventRetry's
// Delay is that wait, not the time until the clock catches up.
func (kafkaHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, DeadLetter: true, TransportTime: true}
}

const brokertestTopic = "orders"

func (kafkaHarness) Open(t *testing.T) brokertest.Transport {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, brokertestTopic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &kafkaTransport{t: t, cluster: c, prod: producer(t, c), group: testenv.UniqueName("brokertest"), keys: map[int64]string{}}
}

type kafkaTransport struct {
	t       *testing.T
	cluster *kfake.Cluster
	prod    *kgo.Client
	group   string
	mu      sync.Mutex
	keys    map[int64]string // by offset
}

// keyAt returns the key of the record published at offset.
func (tr *kafkaTransport) keyAt(offset int64) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.keys[offset]
}

// Publish produces m to partition 0: the key as the record key and the
// default key header (idempotency-key), m.Headers as record headers, and
// m.TransportTime, when set, as the record timestamp.
func (tr *kafkaTransport) Publish(ctx context.Context, m brokertest.Message) error {
	r := &kgo.Record{Topic: brokertestTopic, Partition: 0, Key: []byte(m.Key), Value: m.Body, Timestamp: m.TransportTime}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.DefaultKeyHeader, Value: []byte(m.Key)})
	for k, v := range m.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if err := tr.prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		return err
	}
	tr.mu.Lock()
	tr.keys[r.Offset] = m.Key
	tr.mu.Unlock()
	return nil
}

// errKilled fails the transaction of a record in flight when its consumer
// is killed: a process that dies before its commit leaves nothing behind.
var errKilled = errors.New("brokertest harness: the consumer was killed before the commit")

// NewConsumer builds kafka.NewConsumer or kafka.NewBatchConsumer (the key
// in the default header) with the offsets table and the dead-letter outbox
// in the scenario's schema (the claim table's), and maps the observer's
// record events to settlements.
func (tr *kafkaTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	db := cfg.DB
	schema, _, _ := strings.Cut(cfg.Middleware.Table(), ".")
	if err := kafka.EnsureSchema(context.Background(), db, schema+".kafka_offsets"); err != nil {
		tr.t.Fatal(err)
	}
	c := &kafkaConsumer{tr: tr, assigned: make(chan struct{})}
	opts := []kafka.Option{
		kafka.WithWorkers(cfg.Workers), kafka.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond),
		kafka.WithOffsetsTable(schema + ".kafka_offsets"),
		kafka.WithDeadLetter(newOutbox(tr.t, db, schema, cfg.Middleware.Consumer()), "orders.dead"),
		kafka.WithObserver(kafka.ObserverFunc(func(_ context.Context, e kafka.Event) { c.observe(cfg.OnSettle, e) })),
	}
	if cfg.NoEventTime {
		opts = append(opts, kafka.WithoutEventTime())
	}
	var err error
	if cfg.Batch {
		opts = append(opts, kafka.WithMaxPollRecords(cfg.BatchSize))
		c.c, err = kafka.NewBatchConsumer(db, cfg.Middleware, nil, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			bodies := make([][]byte, len(rs))
			for i, r := range rs {
				bodies[i] = r.Value
			}
			return c.unlessKilled(cfg.BatchHandler(ctx, tx, bodies))
		}, opts...)
	} else {
		c.c, err = kafka.NewConsumer(db, cfg.Middleware, nil, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
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

// observe reports record events as settlements: applied and duplicate as
// Ack; retry, fenced and stopped (a handler that ended the transaction) as
// Requeue; dead-lettered and dropped as Poison; abandoned records (left at
// a shutdown, read again by the next member) as a Requeue without error.
func (c *kafkaConsumer) observe(settle func(brokertest.Settlement), e kafka.Event) {
	s := brokertest.Settlement{Key: e.Key, Err: e.Err}
	if s.Key == "" {
		// The batch consumer's retry names the batch by its first
		// record's offset, and its dead-lettered events carry no key.
		s.Key = c.tr.keyAt(e.Offset)
	}
	switch e.Type {
	case kafka.EventAssigned:
		if len(e.Partitions[brokertestTopic]) > 0 {
			c.once.Do(func() { close(c.assigned) })
		}
		return
	case kafka.EventApplied, kafka.EventDuplicate:
		s.Action = adapter.Ack
	case kafka.EventRetry:
		s.Action, s.Delay = adapter.Requeue, e.Delay
	case kafka.EventFenced, kafka.EventStopped, kafka.EventAbandoned:
		s.Action = adapter.Requeue
	case kafka.EventDeadLettered, kafka.EventDropped:
		s.Action = adapter.DeadLetter
	default:
		return
	}
	if s.Key != "" {
		settle(s)
	}
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
