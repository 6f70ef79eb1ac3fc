//go:build loyalty_sqs

package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub/awssnssqs"
)

// The SQS part: -broker sqs, the Go CDK's pub/sub through its awssnssqs
// driver on the SQS API server of -sqs. The run's topic, processes and
// consumers are pubsub.go's; the service is a standard SQS queue of the
// run's own instead of mempubsub.
func init() {
	brokers["sqs"] = brokerMode{start: startSQS}
}

// sqsVisibilityTimeout is the run's queue's visibility timeout: how long a
// message received by a process that crashed, or whose delete was lost,
// waits before SQS delivers it again.
const sqsVisibilityTimeout = "2"

// startSQS checks that the server of -sqs answers. The credentials are
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY when set, else dummies (an
// SQS API server such as moto's takes any); the region AWS_REGION, else
// us-east-1.
func startSQS(ctx context.Context, o options) (brokerSetup, error) {
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}
	id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if id == "" || secret == "" {
		id, secret = "test", "test"
	}
	cfg := aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider(id, secret, os.Getenv("AWS_SESSION_TOKEN"))}
	client := sqs.NewFromConfig(cfg, func(so *sqs.Options) {
		so.BaseEndpoint = aws.String(o.sqsEndpoint)
		so.RetryMaxAttempts = 1
	})
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := client.ListQueues(lctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		return brokerSetup{}, fmt.Errorf("broker %s does not answer: %w", o.brokerDesc, err)
	}
	client = sqs.NewFromConfig(cfg, func(so *sqs.Options) { so.BaseEndpoint = aws.String(o.sqsEndpoint) })
	return brokerSetup{
		desc:      o.brokerDesc,
		newBroker: func() (broker, error) { return newSQSQueue(ctx, client, o.brokerDesc) },
		naive:     (*store).naivePubsub, library: (*store).libraryPubsub,
		restart: 200 * time.Millisecond,
	}, nil
}

// newSQSQueue creates a run's queue, with a random name, deleted by the
// topic's close, and the topic and subscription on it. The subscription
// takes one message per ReceiveMessage, as the demo's other brokers
// prefetch one per worker: none waits in a buffer while its visibility
// timeout runs.
func newSQSQueue(ctx context.Context, client *sqs.Client, desc string) (*pubsubTopic, error) {
	name := "loyalty-demo-" + randomHex(4)
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name),
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): sqsVisibilityTimeout}})
	if err != nil {
		return nil, fmt.Errorf("broker %s: create queue %s: %w", desc, name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t := newServiceTopic(desc, awssnssqs.OpenSQSTopicV2(ctx, client, url, nil),
		awssnssqs.OpenSubscriptionV2(ctx, client, url, &awssnssqs.SubscriptionOptions{Raw: true, ReceiveBatcherOptions: oneAtATime}))
	t.cleanup = func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = client.DeleteQueue(dctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}
	return t, nil
}
