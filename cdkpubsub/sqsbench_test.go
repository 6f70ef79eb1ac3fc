package cdkpubsub_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub/awssnssqs"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
)

// BenchmarkSQSPerMessageVsBatch measures, side by side in one run, how
// many messages per second a per-message Consumer (one transaction per
// message) and a batch Consumer (one per batch of up to 100) apply from a
// standard SQS queue on the moto server through awssnssqs into Postgres,
// each with 4 workers, on a queue and ledger of its own; the queue is
// filled before the consumer starts.
func BenchmarkSQSPerMessageVsBatch(b *testing.B) {
	perMessageVsBatch(b, 200, consumeAllSQS)
}

// consumeAllSQS sends orders to a new queue (visibility timeout 60s) and
// runs c on a subscription of it until every order is acked, and returns
// how long the run took.
func consumeAllSQS(b *testing.B, c *cdkpubsub.Consumer, orders []order) time.Duration {
	b.Helper()
	ctx := context.Background()
	client := newSQSClient(b, nil)
	url := createQueue(b, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "60"})
	topic := awssnssqs.OpenSQSTopicV2(ctx, client, url, nil)
	defer topic.Shutdown(ctx)
	at := map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}
	errs := make(chan error, len(orders))
	for _, o := range orders { // concurrent sends: awssnssqs batches them, 10 per request
		go func() {
			body, _ := json.Marshal(o)
			errs <- sqsSend(ctx, topic, o.Key(), at, body, "", "")
		}()
	}
	for range orders {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	sub := awssnssqs.OpenSubscriptionV2(ctx, client, url, &awssnssqs.SubscriptionOptions{Raw: true})
	return drain(ctx, b, c, sub, len(orders), 5*time.Minute)
}
