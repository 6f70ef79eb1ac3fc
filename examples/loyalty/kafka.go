//go:build loyalty_kafka

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The Kafka part: -broker kafka, on the in-process kfake cluster or the
// one of -kafka.
func init() {
	brokers["kafka"] = brokerMode{start: func(ctx context.Context, o options) (brokerSetup, error) {
		cluster, err := startKafka(ctx, o.kafkaBrokers, o.brokerDesc, o.consumers*o.workers)
		if err != nil {
			return brokerSetup{}, err
		}
		restart := 20 * time.Millisecond
		if o.kafkaBrokers != nil {
			restart = 200 * time.Millisecond
		}
		return brokerSetup{
			desc:      o.brokerDesc,
			newBroker: func() (broker, error) { return cluster.newTopic(ctx) },
			naive:     (*store).naiveKafka, library: (*store).libraryKafka,
			restart: restart, close: cluster.close,
		}, nil
	}}
}

// kafkaCluster is the run's Kafka: an in-process kfake cluster, or a real
// one reached through seed brokers.
type kafkaCluster struct {
	fake       *kfake.Cluster
	seeds      []string
	desc       string
	partitions int32
	admin      *kgo.Client
}

// startKafka starts the in-process cluster (seeds nil) or checks that the
// real one answers.
func startKafka(ctx context.Context, seeds []string, desc string, partitions int) (*kafkaCluster, error) {
	c := &kafkaCluster{seeds: seeds, desc: desc, partitions: int32(partitions)}
	if seeds == nil {
		var err error
		if c.fake, err = kfake.NewCluster(kfake.NumBrokers(3)); err != nil {
			return nil, fmt.Errorf("in-process Kafka cluster: %w", err)
		}
		c.seeds = c.fake.ListenAddrs()
	}
	var err error
	if c.admin, err = kgo.NewClient(kgo.SeedBrokers(c.seeds...)); err != nil {
		c.close()
		return nil, fmt.Errorf("broker %s: %w", c.desc, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.admin.Ping(pctx); err != nil {
		c.close()
		return nil, fmt.Errorf("broker %s does not answer: %w", c.desc, err)
	}
	return c, nil
}

func (c *kafkaCluster) close() {
	if c.admin != nil {
		c.admin.Close()
	}
	if c.fake != nil {
		c.fake.Close()
	}
}

// newTopic creates a run's topic, with a random name, deleted by its close.
func (c *kafkaCluster) newTopic(ctx context.Context) (*kafkaTopic, error) {
	name := "loyalty-demo-" + randomHex(4)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, c.partitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, c.admin)
	if err == nil && len(resp.Topics) == 1 {
		if e := resp.Topics[0].ErrorCode; e != 0 {
			err = fmt.Errorf("error code %d", e)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("broker %s: create topic %s: %w", c.desc, name, err)
	}
	t := &kafkaTopic{c: c, name: name}
	if t.prod, err = kgo.NewClient(kgo.SeedBrokers(c.seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(name)); err != nil {
		_ = t.close()
		return nil, fmt.Errorf("broker %s: %w", c.desc, err)
	}
	return t, nil
}

// kafkaTopic is one run's topic; it implements broker.
type kafkaTopic struct {
	c    *kafkaCluster
	name string
	prod *kgo.Client

	mu     sync.Mutex
	copies map[[2]int64]int64 // (partition, offset) → copy id
	group  string             // the consumer group of the run's consumers
	// stored, when set, sums the next offsets the run's consumers store in
	// the database: where the library's consumers resume, and so what is
	// still pending. Kafka's committed offsets are for lag tools only: a
	// member that takes over a partition whose records were all applied
	// before a crash has nothing to commit, so Kafka's lag would stay.
	stored func(context.Context) (int64, error)
}

func (t *kafkaTopic) describe() string  { return t.c.desc }
func (t *kafkaTopic) queueName() string { return t.name }

// publish produces msgs as records, the message id in the idempotency-key
// header. The records are unkeyed, spread over the partitions in turn, so
// that an order published twice back to back lands on two neighbouring
// partitions, read by two workers at once.
func (t *kafkaTopic) publish(ctx context.Context, msgs []amqp.Publishing) error {
	recs := make([]*kgo.Record, 0, len(msgs))
	for _, m := range msgs {
		id, _ := m.Headers[copyHeader].(int64)
		r := &kgo.Record{Value: m.Body, Timestamp: m.Timestamp, Partition: int32(id % int64(t.c.partitions)),
			Headers: []kgo.RecordHeader{
				{Key: kafka.DefaultKeyHeader, Value: []byte(m.MessageId)},
				{Key: copyHeader, Value: []byte(strconv.FormatInt(id, 10))},
			}}
		for k, v := range m.Headers {
			if s, ok := v.(string); ok {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(s)})
			}
		}
		recs = append(recs, r)
	}
	if err := t.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.copies == nil {
		t.copies = map[[2]int64]int64{}
	}
	for _, r := range recs {
		t.copies[[2]int64{int64(r.Partition), r.Offset}] = copyOf(r)
	}
	return nil
}

// copyAt returns the copy id of the record at partition and offset.
func (t *kafkaTopic) copyAt(partition int32, offset int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.copies[[2]int64{int64(partition), offset}]; ok {
		return id
	}
	return -1
}

// pending is the run's consumer group's lag as Kafka knows it: the
// partitions' end offsets less the offsets the group committed to Kafka
// (the naive consumer after each poll; the library after each database
// commit, for lag tools). The scenario counts a record settled when its
// consumer reports it committed; pending is what it asks when that count
// stalls, as it does when a commit landed but the process crashed before
// it could say so.
func (t *kafkaTopic) pending(ctx context.Context) (int, error) {
	t.mu.Lock()
	group := t.group
	t.mu.Unlock()
	lreq := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = t.name
	freq := kmsg.NewPtrOffsetFetchRequest()
	freq.Group = group
	ft := kmsg.NewOffsetFetchRequestTopic()
	ft.Topic = t.name
	for p := range t.c.partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p, -1 // the end
		lt.Partitions = append(lt.Partitions, lp)
		ft.Partitions = append(ft.Partitions, p)
	}
	lreq.Topics = append(lreq.Topics, lt)
	freq.Topics = append(freq.Topics, ft)
	lresp, err := lreq.RequestWith(ctx, t.c.admin)
	if err != nil {
		return 0, fmt.Errorf("end offsets of %s: %w", t.name, err)
	}
	n := int64(0)
	for _, rt := range lresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return 0, fmt.Errorf("end offset of %s/%d: %w", t.name, rp.Partition, err)
			}
			n += rp.Offset
		}
	}
	t.mu.Lock()
	stored := t.stored
	t.mu.Unlock()
	if stored != nil {
		s, err := stored(ctx)
		if err != nil {
			return 0, fmt.Errorf("stored offsets of %s: %w", t.name, err)
		}
		return int(n - s), nil
	}
	if group == "" {
		return int(n), nil
	}
	fresp, err := freq.RequestWith(ctx, t.c.admin)
	if err != nil {
		return 0, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if err := kerr.ErrorForCode(fresp.ErrorCode); err != nil {
		return 0, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	for _, rt := range fresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return 0, fmt.Errorf("committed offset of %s/%d: %w", t.name, rp.Partition, err)
			}
			if rp.Offset > 0 {
				n -= rp.Offset
			}
		}
	}
	return int(n), nil
}

// deadLettered is 0: the loyalty events are never poison.
func (t *kafkaTopic) deadLettered(context.Context) (int, error) { return 0, nil }

func (t *kafkaTopic) connect(context.Context) (brokerConn, error) { return &kafkaConn{}, nil }

func (t *kafkaTopic) close() error {
	if t.prod != nil {
		t.prod.Close()
	}
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.TopicNames = []string{t.name}
	rt := kmsg.NewDeleteTopicsRequestTopic()
	rt.Topic = kmsg.StringPtr(t.name)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := req.RequestWith(ctx, t.c.admin)
	return err
}

// clientOpts are a consumer process's client options: group members of
// the run's group, on the process's connections.
func (t *kafkaTopic) clientOpts(conn *kafkaConn, group string) []kgo.Opt {
	t.mu.Lock()
	t.group = group + "-" + t.name
	t.mu.Unlock()
	return []kgo.Opt{
		kgo.SeedBrokers(t.c.seeds...), kgo.Dialer(conn.dial),
		kgo.ConsumerGroup(group + "-" + t.name), kgo.ConsumeTopics(t.name),
		// Rebalances after each crash take a heartbeat, not the default 3s.
		kgo.HeartbeatInterval(100 * time.Millisecond), kgo.FetchMaxWait(500 * time.Millisecond),
	}
}

// kafkaConn is one consumer process's connections to the brokers.
type kafkaConn struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *kafkaConn) dial(ctx context.Context, network, host string) (net.Conn, error) {
	nc, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.conns = append(c.conns, nc)
	c.mu.Unlock()
	return nc, nil
}

// drop closes the process's sockets under its client, as a crash or a
// network failure does.
func (c *kafkaConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nc := range c.conns {
		_ = nc.Close()
	}
	c.conns = nil
}

func (c *kafkaConn) channel() (rabbitmq.Channel, error) {
	return nil, errors.New("a Kafka connection has no AMQP channel")
}

func (c *kafkaConn) close() {}

// copyOf returns the copy id a record carries.
func copyOf(r *kgo.Record) int64 {
	for _, h := range r.Headers {
		if h.Key == copyHeader {
			if id, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				return id
			}
		}
	}
	return -1
}

// naiveKafka is the usual hand-written franz-go loop around the naive
// check-then-act: poll, apply the records (the partitions of a poll
// concurrently), then commit the offsets to Kafka after the database has
// committed. A crash between the two replays the poll's records, and a
// rebalance can hand a partition to a new owner while the old one is still
// applying it: with an eager balancer (round-robin, the classic protocol),
// every rebalance revokes every partition, and nothing waits for the
// records in flight.
func (s *store) naiveKafka(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*kafkaConn), sc.b.(*kafkaTopic)
		cl, err := kgo.NewClient(append(t.clientOpts(conn, "loyalty-naive"), kgo.DisableAutoCommit(), kgo.Balancers(kgo.RoundRobinBalancer()))...)
		if err != nil {
			return err
		}
		defer cl.Close()
		for {
			fetches := cl.PollRecords(ctx, 100*sc.workers)
			if ctx.Err() != nil {
				return nil
			}
			if fetches.IsClientClosed() {
				return errors.New("client closed")
			}
			var crashed atomic.Bool
			var wg sync.WaitGroup
			sem := make(chan struct{}, sc.workers)
			fetches.EachPartition(func(p kgo.FetchTopicPartition) {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					for _, r := range p.Records {
						// A crash: committed, and the process dies
						// before its offsets reach Kafka.
						if !sc.naiveDeliver(ctx, apply, r.Value, &crashed, conn.drop) {
							return
						}
					}
				})
			})
			wg.Wait()
			if crashed.Load() {
				return errCrashed
			}
			if ctx.Err() != nil {
				return nil
			}
			// After the database commits: the offsets to Kafka. A failed
			// commit (a dropped connection, a rebalance) is retried with
			// the next poll's, as such loops do.
			if err := cl.CommitUncommittedOffsets(ctx); err != nil {
				continue
			}
			fetches.EachRecord(func(r *kgo.Record) { sc.settle(copyOf(r)) })
		}
	}, credited, nil
}

// libraryKafka is the same consumer through kafka.NewConsumer: claim,
// credit and the partition's offset in one transaction; the Consumer seeks
// each assigned partition to the offset stored in the database.
func (s *store) libraryKafka(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	offsets := s.prefix + "kafka_offsets"
	s.tables = append(s.tables, offsets)
	if err := kafka.EnsureSchema(ctx, s.db, offsets); err != nil {
		return nil, nil, err
	}
	// The key is the order id from the value: a natural key that survives
	// a replay tool assigning new message ids (the idempotency-key header).
	key := kafka.Prefixed("order-completed:", kafka.BodyField("order_id"))
	h := kafka.Decode(kafka.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *kgo.Record) error {
		// The Consumer opens the transaction before the handler runs, so
		// the price lookup waits inside it here.
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*kafkaConn), sc.b.(*kafkaTopic)
		t.mu.Lock()
		t.stored = func(ctx context.Context) (int64, error) {
			var n int64
			err := s.db.QueryRowContext(ctx, "SELECT coalesce(sum(next_offset), 0)::bigint FROM "+offsets+" WHERE consumer = $1 AND topic = $2", mw.Config().Consumer, t.name).Scan(&n)
			return n, err
		}
		t.mu.Unlock()
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			if e.Type != adapter.EventApplied && e.Type != adapter.EventDuplicate {
				return
			}
			// The record's transaction committed.
			n := sc.deliveries.Add(1)
			if e.Type == adapter.EventDuplicate {
				sc.duplicates.Add(1)
			}
			r := e.Detail.(*kgo.Record) // a record event's Detail
			sc.settle(t.copyAt(r.Partition, r.Offset))
			if sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 && !crashed.Swap(true) {
				// The process dies: its sockets close, and the
				// transactions in flight roll back (a shutdown timeout
				// of a millisecond).
				sc.crashes.Add(1)
				conn.drop()
				cancel()
			}
		})
		c, err := kafka.NewConsumer(mw, h, kafka.WithKey(key), kafka.WithWorkers(sc.workers), kafka.WithOffsetsTable(offsets),
			kafka.WithObserver(obs), kafka.WithShutdownTimeout(time.Millisecond), kafka.WithRetryDelay(10*time.Millisecond, time.Second))
		if err != nil {
			return err
		}
		err = c.Run(pctx, t.clientOpts(conn, "loyalty-idempotent")...)
		if crashed.Load() {
			return errCrashed
		}
		return err
	}, credited, nil
}
