package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
)

// TestBacklogKeepsWorkersBusy consumes a backlog whose every partition
// holds as many records as one poll returns: the client hands out buffered
// records partition by partition, so each poll is one partition's, and
// only a round that takes more polls, while its records are of fewer
// partitions than workers, applies the partitions at once. The handler of
// each partition's first record waits until every partition has started.
func TestBacklogKeepsWorkersBusy(t *testing.T) {
	const partitions, perPartition = 4, 4
	db := openDB(t, partitions+2)
	s := schema(t, db)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "backlog"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var recs []*kgo.Record
	for p := range partitions {
		for i := range perPartition {
			recs = append(recs, &kgo.Record{Topic: "backlog", Partition: int32(p),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "k-%d-%d", p, i)}}})
		}
	}
	if err := producer(t, cluster).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	started := map[int32]bool{}
	all := make(chan struct{})
	var late []int32 // partitions whose first record waited in vain
	h := func(ctx context.Context, _ *sql.Tx, r *kgo.Record) error {
		mu.Lock()
		first := !started[r.Partition]
		started[r.Partition] = true
		if len(started) == partitions && first {
			close(all)
		}
		mu.Unlock()
		if !first {
			return nil
		}
		// The bound only ends the wait of a consumer that takes one
		// partition per round, which would wait forever; it is far past
		// what a loaded machine needs to fetch the other partitions, and
		// shorter than waitFor's minute, so that such a consumer is
		// reported as taking one partition per round.
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			mu.Lock()
			late = append(late, r.Partition)
			mu.Unlock()
		}
		return nil
	}
	var applied adapter.Counter
	c, err := kafka.NewConsumer(newMiddleware(t, db, s, "backlog"), h, kafka.WithWorkers(partitions),
		kafka.WithMaxPollRecords(perPartition), kafka.WithObserver(&applied), kafka.WithoutEventTime(),
		kafka.WithOffsetsTable(s+".kafka_offsets"))
	if err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "backlog", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("backlog"),
		kgo.ConsumeTopics("backlog"), kgo.FetchMaxWait(20*time.Millisecond))
	waitFor(t, "every record applied", func() (bool, error) { return applied.Stats().Applied == partitions*perPartition, nil })
	m.stop(t)
	if len(late) > 0 {
		t.Errorf("partitions %v started while the others had not: one partition per round", late)
	}
}
