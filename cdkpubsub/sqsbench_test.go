package cdkpubsub_test

import (
	"context"
	"testing"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/awssnssqs"

	"github.com/txclaim/idempotent/cdkpubsub"
)

// BenchmarkSQSPerMessageVsBatch measures, side by side in one run, how
// many messages per second a per-message Consumer (one transaction per
// message) and a batch Consumer (one per batch of up to 100) apply from
// standard SQS queues on the moto server through awssnssqs into Postgres,
// each with 4 workers per queue, on queues and a ledger of its own; the
// orders are spread over sqsKillQueues queues (moto's work per message
// grows with the queue's depth), filled before the consumer starts.
func BenchmarkSQSPerMessageVsBatch(b *testing.B) {
	perMessageVsBatch(b, 200, consumeAllSQS)
}

// consumeAllSQS sends orders to sqsKillQueues new queues (visibility
// timeout 60s), ten to a SendMessageBatch, and runs c on a subscription of
// each (sqsSubscriptionOptions) until every order is acked, and returns how
// long the run took.
func consumeAllSQS(b *testing.B, c *cdkpubsub.Consumer, orders []order) time.Duration {
	b.Helper()
	ctx := context.Background()
	client := newSQSClient(b, nil)
	urls := make([]string, sqsKillQueues)
	for i := range urls {
		urls[i] = createQueue(b, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "60"})
	}
	all := func() (int64, error) { return 0, nil } // a window of every order: no waiting
	if _, err := produceOrders(ctx, client, urls, orders, nil, len(orders), all); err != nil {
		b.Fatal(err)
	}
	subs := make([]*pubsub.Subscription, len(urls))
	for i, url := range urls {
		subs[i] = awssnssqs.OpenSubscriptionV2(ctx, client, url, sqsSubscriptionOptions())
	}
	return drain(ctx, b, c, len(orders), 5*time.Minute, subs...)
}
