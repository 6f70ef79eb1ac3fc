package cdkpubsub_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/awssnssqs"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
)

// The SQS tests run through gocloud.dev's awssnssqs driver (AWS SDK v2)
// against a real SQS API server: moto's, at IDEMPOTENT_SQS_ENDPOINT
// (default http://127.0.0.1:5000, started by scripts/services.sh), or, when
// nothing answers there, a moto_server of the tests' own on a free port.
// The credentials are dummies, set on the client here only.

const defaultSQSEndpoint = "http://127.0.0.1:5000"

var (
	sqsEndpointOnce sync.Once
	sqsEndpoint     string
	sqsEndpointErr  error
)

// sqsURL returns the SQS API server's endpoint, starting a moto_server when
// none answers; it calls Unavailable when there is none and none can start.
func sqsURL(t testing.TB) string {
	t.Helper()
	sqsEndpointOnce.Do(func() {
		ep := testenv.Getenv("IDEMPOTENT_SQS_ENDPOINT", defaultSQSEndpoint)
		if answers(ep) {
			sqsEndpoint = ep
			return
		}
		sqsEndpoint, _, sqsEndpointErr = startMoto()
	})
	if sqsEndpointErr != nil {
		testenv.Unavailable(t, "no SQS API server: %v", sqsEndpointErr)
	}
	return sqsEndpoint
}

// answers reports whether something accepts TCP connections at endpoint's
// host and port.
func answers(endpoint string) bool {
	host := strings.TrimPrefix(strings.TrimPrefix(endpoint, "http://"), "https://")
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// startMoto starts moto_server on a free loopback port, killed when the
// test binary exits (see killWithParent) or by stop, and waits for it to
// answer.
func startMoto() (endpoint string, stop func(), err error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return "", nil, fmt.Errorf("moto_server is not on PATH (pip install 'moto[server]'): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	killWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start moto_server: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	ep := "http://127.0.0.1:" + strconv.Itoa(port)
	for range 300 { // a bounded wait for a server starting: 30s
		if answers(ep) {
			return ep, stop, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("moto_server did not answer on %s within 30s", ep)
}

// newSQSClient returns an SQS client of the API server, with dummy
// credentials; rt, when not nil, sees every HTTP exchange.
func newSQSClient(t testing.TB, rt http.RoundTripper) *sqs.Client {
	t.Helper()
	return sqsClientAt(sqsURL(t), rt)
}

// sqsClientAt returns an SQS client of the API server at endpoint, with
// dummy credentials; rt, when not nil, sees every HTTP exchange.
func sqsClientAt(endpoint string, rt http.RoundTripper) *sqs.Client {
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		if rt != nil {
			o.HTTPClient = &http.Client{Transport: rt}
		}
	})
}

// createQueue creates a queue of the test's own with attrs, deleted in
// Cleanup, and returns its URL. A FIFO queue's name ends in ".fifo".
func createQueue(t testing.TB, client *sqs.Client, fifo bool, attrs map[string]string) string {
	t.Helper()
	name := testenv.UniqueName("idempotent")
	a := map[string]string{}
	for k, v := range attrs {
		a[k] = v
	}
	if fifo {
		name += ".fifo"
		a[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
	}
	out, err := client.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}

// queueArn returns the ARN of the queue at url.
func queueArn(t testing.TB, client *sqs.Client, url string) string {
	t.Helper()
	out, err := client.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
}

// queueDepth returns how many messages the queue at url holds, visible and
// in flight.
func queueDepth(t testing.TB, client *sqs.Client, url string) int {
	t.Helper()
	out, err := client.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range out.Attributes {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		n += i
	}
	return n
}

// randomID returns 16 random hex digits: a MessageDeduplicationId no other
// send has.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sqsSend sends body with the key and event time as message attributes,
// and, on a FIFO queue, the message group and deduplication id given.
func sqsSend(ctx context.Context, topic *pubsub.Topic, key string, headers map[string]string, body []byte, group, dedup string) error {
	md := map[string]string{cdkpubsub.DefaultKeyMetadata: key}
	for k, v := range headers {
		md[k] = v
	}
	if group != "" {
		md[awssnssqs.MetadataKeyMessageGroupID] = group
		md[awssnssqs.MetadataKeyDeduplicationID] = dedup
	}
	return topic.Send(ctx, &pubsub.Message{Body: body, Metadata: md})
}

// TestBrokertestSQS runs the conformance suite through awssnssqs on a
// standard queue and on a FIFO queue (message group: the key; a
// deduplication id of each send's own, so that the suite's re-sends reach
// the consumer as a producer's retry after the five-minute window does),
// per message and in batches, with a two-second visibility timeout so that
// what a killed consumer did not delete comes back soon.
func TestBrokertestSQS(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			brokertest.Run(t, sqsHarness{client: newSQSClient(t, nil), fifo: fifo})
		})
	}
}

type sqsHarness struct {
	client *sqs.Client
	fifo   bool
}

func (sqsHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, Kill: true, Restart: true, Ordered: true}
}

func (h sqsHarness) Open(t *testing.T) brokertest.Transport {
	url := createQueue(t, h.client, h.fifo, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "2"})
	topic := awssnssqs.OpenSQSTopicV2(context.Background(), h.client, url, nil)
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	return &sqsTransport{h: h, url: url, topic: topic}
}

type sqsTransport struct {
	h     sqsHarness
	url   string
	topic *pubsub.Topic
}

func (tr *sqsTransport) Publish(ctx context.Context, m brokertest.Message) error {
	group := ""
	if tr.h.fifo {
		group = m.Key
	}
	return sqsSend(ctx, tr.topic, m.Key, m.Headers, m.Body, group, randomID())
}

func (tr *sqsTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	c := &sqsConsumer{tr: tr}
	var err error
	c.c, err = newSuiteConsumer(cfg)
	return c, err
}

// sqsConsumer is a consumer process: a Subscription of its own on the
// scenario's queue, and a Run.
type sqsConsumer struct {
	subRun
	tr *sqsTransport
}

func (c *sqsConsumer) Start(context.Context) error {
	c.start(awssnssqs.OpenSubscriptionV2(context.Background(), c.tr.h.client, c.tr.url, &awssnssqs.SubscriptionOptions{Raw: true}))
	return nil
}

// Kill shuts the Subscription down at once, as a crash does, without
// waiting for the handlers: what it had not deleted becomes visible again
// when its visibility timeout passes.
func (c *sqsConsumer) Kill() error {
	return c.crash()
}

// receiveWatch is an http.RoundTripper that reads every ReceiveMessage
// answer and tells, through a channel, when a message came with an
// ApproximateReceiveCount of at least n: the server delivered it again.
type receiveWatch struct {
	n    int
	once sync.Once
	seen chan struct{}
}

func (w *receiveWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".ReceiveMessage") {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var out struct {
		Messages []struct{ Attributes map[string]string }
	}
	if json.Unmarshal(body, &out) == nil {
		for _, m := range out.Messages {
			if c, _ := strconv.Atoi(m.Attributes["ApproximateReceiveCount"]); c >= w.n {
				w.once.Do(func() { close(w.seen) })
			}
		}
	}
	return resp, nil
}

// A handler that runs past the queue's visibility timeout: SQS delivers
// the message again, to the consumer's other worker, while the first
// handler holds the claim. The first handler goes on only once the second
// delivery has been received; that delivery waits on the claim, or finds it
// committed: a Duplicate, and the effect is applied once.
func TestSQSVisibilityTimeoutExpiresMidHandler(t *testing.T) {
	t.Parallel()
	watch := &receiveWatch{n: 2, seen: make(chan struct{})}
	client := newSQSClient(t, watch)
	url := createQueue(t, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "1"})
	l := newLedger(t)
	rec := testenv.NewRecorder()
	runs := 0
	var mu sync.Mutex
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		mu.Lock()
		runs++
		first := runs == 1
		mu.Unlock()
		if first {
			select {
			case <-watch.seen:
			case <-time.After(30 * time.Second):
				t.Error("the message was not delivered again while its handler ran")
			}
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithObserver(rec), cdkpubsub.WithWorkers(2), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	topic := awssnssqs.OpenSQSTopicV2(context.Background(), client, url, nil)
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	o := order{OrderID: 21, CustomerID: 8, Points: 5}
	body, _ := json.Marshal(o)
	if err := sqsSend(context.Background(), topic, o.Key(), map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}, body, "", ""); err != nil {
		t.Fatal(err)
	}
	sub := awssnssqs.OpenSubscriptionV2(context.Background(), client, url, &awssnssqs.SubscriptionOptions{Raw: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sub) }()
	rec.Until(t, 60*time.Second, "applied, and a later delivery a Duplicate", func() bool {
		return rec.Count(adapter.EventApplied, o.Key()) == 1 && rec.Count(adapter.EventDuplicate, o.Key()) >= 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := sub.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	mu.Lock()
	if runs != 1 {
		t.Errorf("the handler ran %d times, want 1", runs)
	}
	mu.Unlock()
	t.Logf("1 applied, %d duplicates, %d requeued", rec.Count(adapter.EventDuplicate, o.Key()), rec.Count(adapter.EventRequeued, o.Key()))
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// On a FIFO queue SQS drops a send whose MessageDeduplicationId it saw in
// the last five minutes, and only then. A producer's retry within the
// window reuses the id and is dropped; a retry after it is a new message
// (here: a new id, which is what the server sees either way), delivered,
// and the claim makes it a Duplicate: one effect.
func TestSQSFIFORetryAfterDeduplicationWindow(t *testing.T) {
	t.Parallel()
	client := newSQSClient(t, nil)
	url := createQueue(t, client, true, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "5"})
	l := newLedger(t)
	rec := testenv.NewRecorder()
	c, err := cdkpubsub.NewConsumer(l.mw, l.handler(), cdkpubsub.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	topic := awssnssqs.OpenSQSTopicV2(context.Background(), client, url, nil)
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	o := order{OrderID: 31, CustomerID: 9, Points: 12}
	body, _ := json.Marshal(o)
	md := map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}
	ctx := context.Background()
	for _, dedup := range []string{"first-send", "first-send", "retry-after-the-window"} {
		if err := sqsSend(ctx, topic, o.Key(), md, body, "customer-9", dedup); err != nil {
			t.Fatal(err)
		}
	}
	if n := queueDepth(t, client, url); n != 2 {
		t.Fatalf("the queue holds %d messages, want 2: the second send, with the first's deduplication id, dropped", n)
	}
	sub := awssnssqs.OpenSubscriptionV2(ctx, client, url, &awssnssqs.SubscriptionOptions{Raw: true})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, sub) }()
	rec.Until(t, 30*time.Second, "applied, then a Duplicate", func() bool {
		return rec.Count(adapter.EventApplied, o.Key()) == 1 && rec.Count(adapter.EventDuplicate, o.Key()) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := sub.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if n := queueDepth(t, client, url); n != 0 {
		t.Errorf("the queue still holds %d messages after both were acked", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// A queue's redrive policy and the library's dead letter are two different
// things. SQS moves a message to the redrive policy's queue once it has been
// received maxReceiveCount times without being deleted: here a message whose
// handler always fails, requeued (nacked) on each delivery, nothing written.
// Poison is the library's: settled DeadLetter on its first delivery and
// deleted, so it never reaches the redrive queue.
func TestSQSRedrivePolicyBesideTheLibrarysDeadLetter(t *testing.T) {
	t.Parallel()
	client := newSQSClient(t, nil)
	dlq := createQueue(t, client, false, nil)
	redrive := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"2"}`, queueArn(t, client, dlq))
	url := createQueue(t, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): "5",
		string(sqstypes.QueueAttributeNameRedrivePolicy): redrive})
	l := newLedger(t)
	rec := testenv.NewRecorder()
	failing := order{OrderID: 41, CustomerID: 10, Points: 1}
	credit := l.handler()
	c, err := cdkpubsub.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		if m.Metadata[cdkpubsub.DefaultKeyMetadata] == failing.Key() {
			return fmt.Errorf("the ledger refuses %s", failing.Key())
		}
		return credit(ctx, tx, m)
	}, cdkpubsub.WithObserver(rec), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	topic := awssnssqs.OpenSQSTopicV2(context.Background(), client, url, nil)
	t.Cleanup(func() { _ = topic.Shutdown(context.Background()) })
	ctx := context.Background()
	at := map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}
	body, _ := json.Marshal(failing)
	if err := sqsSend(ctx, topic, failing.Key(), at, body, "", ""); err != nil {
		t.Fatal(err)
	}
	if err := sqsSend(ctx, topic, "poison-1", map[string]string{adapter.EventTimeHeader: "yesterday"}, []byte(`{}`), "", ""); err != nil {
		t.Fatal(err)
	}
	sub := awssnssqs.OpenSubscriptionV2(ctx, client, url, &awssnssqs.SubscriptionOptions{Raw: true})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, sub) }()
	// The failing message is requeued on its two deliveries; at the third
	// receive SQS moves it to the redrive queue instead.
	dsub := awssnssqs.OpenSubscriptionV2(ctx, client, dlq, &awssnssqs.SubscriptionOptions{Raw: true})
	dctx, dcancel := context.WithTimeout(ctx, 60*time.Second)
	moved, err := dsub.Receive(dctx)
	dcancel()
	if err != nil {
		t.Fatalf("the redrive queue: %v", err)
	}
	moved.Ack()
	if err := dsub.Shutdown(ctx); err != nil { // sends the ack
		t.Errorf("Shutdown: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := sub.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if k := moved.Metadata[cdkpubsub.DefaultKeyMetadata]; k != failing.Key() {
		t.Errorf("the redrive queue got %q, want %q", k, failing.Key())
	}
	if n := rec.Count(adapter.EventRequeued, failing.Key()); n != 2 {
		t.Errorf("%s requeued %d times, want 2 (maxReceiveCount)", failing.Key(), n)
	}
	if n := rec.Count(adapter.EventDeadLettered, failing.Key()); n != 0 {
		t.Errorf("%s dead-lettered by the library %d times, want 0: it is SQS's to move", failing.Key(), n)
	}
	if n := rec.Count(adapter.EventDeadLettered, "poison-1"); n != 1 {
		t.Errorf("the poison message dead-lettered %d times, want 1", n)
	}
	if n := queueDepth(t, client, url) + queueDepth(t, client, dlq); n != 0 {
		t.Errorf("%d messages left in the queues, want 0: the poison message deleted, not moved", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, nil)
}
