package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent/adapter"
)

// Lag returns a LagReporter of c on topics (for otelmetrics.ConsumerLag):
// per partition, the records between the offset c stored in its offsets
// table — the one it goes on from — and the partition's high watermark,
// asked of the cluster with cl. A partition with no stored offset lags by
// every record of its log. The Group is the Middleware's consumer name,
// the key of the stored offsets.
func (c *Consumer) Lag(cl *kgo.Client, topics ...string) (adapter.LagReporter, error) {
	if cl == nil {
		return nil, errors.New("kafka: Lag: nil client")
	}
	if len(topics) == 0 {
		return nil, errors.New("kafka: Lag: no topic")
	}
	for _, t := range topics {
		if t == "" {
			return nil, errors.New("kafka: Lag: empty topic name")
		}
	}
	return adapter.LagFunc(func(ctx context.Context) ([]adapter.Lag, error) {
		var out []adapter.Lag
		for _, topic := range topics {
			stored, err := c.loadOffsets(ctx, topic)
			if err != nil {
				return nil, err
			}
			start, end, err := topicBounds(ctx, cl, topic)
			if err != nil {
				return nil, err
			}
			for p, hw := range end {
				from := start[p]
				if s, ok := stored[p]; ok {
					from = s.next
				}
				out = append(out, adapter.Lag{System: "kafka", Group: c.consumer, Destination: topic,
					Partition: strconv.Itoa(int(p)), Messages: max(hw-from, 0)})
			}
		}
		return out, nil
	}), nil
}

// topicBounds asks the cluster for the log start offset and high watermark
// of every partition of topic.
func topicBounds(ctx context.Context, cl *kgo.Client, topic string) (start, end map[int32]int64, err error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = []kmsg.MetadataRequestTopic{mt}
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: lag of %s: metadata: %w", topic, err)
	}
	var parts []int32
	for _, t := range mresp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, nil, fmt.Errorf("kafka: lag of %s: metadata: %w", topic, err)
		}
		for _, p := range t.Partitions {
			parts = append(parts, p.Partition)
		}
	}
	if len(parts) == 0 {
		return nil, nil, fmt.Errorf("kafka: lag of %s: the cluster knows no partition of it", topic)
	}
	bounds := func(ts int64) (map[int32]int64, error) {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range parts {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = p, ts, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID, req.Topics = -1, []kmsg.ListOffsetsRequestTopic{rt}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, fmt.Errorf("kafka: lag of %s: list offsets: %w", topic, err)
		}
		out := map[int32]int64{}
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return nil, fmt.Errorf("kafka: lag of %s partition %d: list offsets: %w", topic, rp.Partition, err)
				}
				out[rp.Partition] = rp.Offset
			}
		}
		return out, nil
	}
	if start, err = bounds(-2); err != nil {
		return nil, nil, err
	}
	if end, err = bounds(-1); err != nil {
		return nil, nil, err
	}
	return start, end, nil
}
