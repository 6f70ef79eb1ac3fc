package cdkpubsub_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/awssnssqs"
	"gocloud.dev/pubsub/batcher"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// sqsConsumerEnv, set in a subprocess of the test binary, makes it an SQS
// consumer process (runSQSConsumer) instead of running tests.
const sqsConsumerEnv = "CDKPUBSUB_TEST_SQS_CONSUMER"

// sqsKillOrdersEnv sets how many orders TestSQSLoadWithDuplicatesAndKilledProcesses
// sends; the full audit is 3,000, the default a cheap 150.
const sqsKillOrdersEnv = "IDEMPOTENT_SQS_KILL_ORDERS"

func TestMain(m *testing.M) {
	if spec := os.Getenv(sqsConsumerEnv); spec != "" {
		os.Exit(runSQSConsumer(spec))
	}
	os.Exit(m.Run())
}

// consumerSpec is what a consumer subprocess consumes, and into which
// ledger.
type consumerSpec struct {
	Endpoint, Schema string
	QueueURLs        []string
	Batch            bool
}

// runSQSConsumer is a consumer process: one Consumer, Run on a
// Subscription of each SQS queue of spec, crediting the ledger of spec's
// schema, until SIGTERM (then it shuts its Subscriptions down, which sends
// the pending deletes, and prints its Stats) or SIGKILL; when one Run
// fails, it stops the others and exits 1. It prints "running" once its
// Runs have started.
func runSQSConsumer(spec string) int {
	var s consumerSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, "spec:", err)
		return 2
	}
	db, err := sql.Open("postgres", testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	db.SetMaxOpenConns(8)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(s.Schema+".processed_messages"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l := &ledger{db: db, schema: s.Schema, mw: mw}
	opts := []cdkpubsub.Option{cdkpubsub.WithWorkers(2), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	var c *cdkpubsub.Consumer
	if s.Batch {
		c, err = cdkpubsub.NewBatchConsumer(mw, l.batchHandler(), append(opts, cdkpubsub.WithBatchSize(20))...)
	} else {
		c, err = cdkpubsub.NewConsumer(mw, l.handler(), opts...)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := sqsClientAt(s.Endpoint, nil)
	subs := make([]*pubsub.Subscription, len(s.QueueURLs))
	for i, url := range s.QueueURLs {
		subs[i] = awssnssqs.OpenSubscriptionV2(ctx, client, url, sqsSubscriptionOptions())
	}
	fmt.Println("running")
	errs := make(chan error, len(subs))
	for _, sub := range subs {
		go func() {
			err := c.Run(runCtx, sub)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var runErr, shutErr error
	for range subs {
		runErr = cmp.Or(runErr, <-errs)
	}
	for _, sub := range subs {
		shutErr = cmp.Or(shutErr, sub.Shutdown(context.Background()))
	}
	st := c.Stats()
	fmt.Printf("stats %d %d %d\n", st.Applied, st.Duplicates, st.Requeued)
	if runErr != nil || shutErr != nil {
		fmt.Fprintln(os.Stderr, "Run:", runErr, "Shutdown:", shutErr)
		return 1
	}
	return 0
}

// sqsSubscriptionOptions are the consumer processes' awssnssqs options:
// raw messages, and deletes sent by one DeleteMessageBatch at a time, so
// that the acks arriving while one is in flight go in the next, up to ten,
// instead of a request each.
func sqsSubscriptionOptions() *awssnssqs.SubscriptionOptions {
	return &awssnssqs.SubscriptionOptions{Raw: true, AckBatcherOptions: batcher.Options{MaxHandlers: 1}}
}

// consumerProc is a consumer subprocess.
type consumerProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{} // closed when it has exited

	mu    sync.Mutex
	lines []string // its stdout so far
}

// startConsumerProc starts a consumer subprocess of spec and waits until it
// runs.
func startConsumerProc(t *testing.T, spec consumerSpec) *consumerProc {
	t.Helper()
	b, _ := json.Marshal(spec)
	p := &consumerProc{done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), sqsConsumerEnv+"="+string(b))
	p.cmd.Stderr = &p.stderr
	killWithParent(p.cmd)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			if sc.Text() == "running" {
				close(running)
			}
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	select {
	case <-running:
	case <-p.done:
		t.Fatalf("a consumer process exited before it ran: %s", p.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("a consumer process did not run within 60s")
	}
	return p
}

// kill sends SIGKILL: the process dies wherever it is — in a handler, in a
// commit, before its deletes were sent — and waits for it.
func (p *consumerProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	<-p.done
}

// stop sends SIGTERM, waits for the process to exit, and returns its
// Stats' Applied, Duplicates and Requeued.
func (p *consumerProc) stop(t *testing.T) (applied, duplicates, requeued int64) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("a consumer process did not exit within 60s of SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 && !p.staleDelete() {
		t.Fatalf("a consumer process exited %d: %s", code, p.stderr.String())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if rest, ok := strings.CutPrefix(l, "stats "); ok {
			if _, err := fmt.Sscan(rest, &applied, &duplicates, &requeued); err != nil {
				t.Fatalf("stats line %q: %v", l, err)
			}
			return applied, duplicates, requeued
		}
	}
	t.Fatalf("a consumer process printed no stats: %q", p.lines)
	return 0, 0, 0
}

// staleDelete reports whether the process's Subscription ended on a
// delete that moto refused: the receipt handle of a delivery whose message
// another delivery's delete had removed (see the test below).
func (p *consumerProc) staleDelete() bool {
	return strings.Contains(p.stderr.String(), "ReceiptHandleIsInvalid")
}

// exited reports whether the process has exited.
func (p *consumerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Orders sent to standard SQS queues, 30% of them twice (a producer's
// re-send), consumed by two consumer processes — subprocesses of the test
// binary — of which one is SIGKILLed and replaced three times mid-stream:
// what a killed process had received and not deleted (handlers running,
// commits in flight, deletes not yet sent) comes again after the
// visibility timeout to the others. Every order is applied exactly once,
// and the balances are exact.
//
// moto's SQS server does work in proportion to a queue's depth for every
// message it sends, receives or deletes (it recounts the queue, reading
// the clock twice per message, for each), so a queue filled with thousands
// drains at a message or two a second. The orders are therefore spread
// over sqsKillQueues queues, sent ten to a SendMessageBatch while the
// consumers run, and at most sqsKillWindow orders ahead of the ledger:
// each queue stays a few dozen deep, as a consumed queue does.
//
// A delivery that waited in a Subscription's buffer past the visibility
// timeout is received again by another process, which deletes it; moto
// then refuses the first delivery's delete (ReceiptHandleIsInvalid), and
// awssnssqs makes a failed batch of deletes the Subscription's error,
// which ends Run. Such a process is restarted, as a supervisor would, and
// counted; its late delete loses nothing, the message being gone. The
// default is 150 orders on the shared SQS server, with a two-second
// visibility timeout; set IDEMPOTENT_SQS_KILL_ORDERS=3000 for the full
// audit, which runs on a moto_server of each subtest's own with a
// ten-second timeout.
func TestSQSLoadWithDuplicatesAndKilledProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test")
	}
	n := 150
	if v := os.Getenv(sqsKillOrdersEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 40 {
			t.Fatalf("%s=%q: want a number of orders, at least 40", sqsKillOrdersEnv, v)
		}
	}
	large := n > 300
	for _, batch := range []bool{false, true} {
		name := "per-message"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			endpoint := sqsURL(t)
			// Two seconds makes a killed process's messages come back soon;
			// a large run gives what waits in a Subscription's buffer longer
			// before another process receives it again, and has a server of
			// its own, so that the two subtests do not queue on one
			// single-threaded Python.
			visibility := "2"
			if large {
				ep, stop, err := startMoto()
				if err != nil {
					testenv.Unavailable(t, "no SQS API server of the test's own: %v", err)
				}
				t.Cleanup(stop)
				endpoint, visibility = ep, "10"
			}
			client := sqsClientAt(endpoint, nil)
			urls := make([]string, sqsKillQueues)
			for i := range urls {
				urls[i] = createQueue(t, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): visibility})
			}
			l := newLedger(t)
			orders := testenv.MakeOrders(n)
			count := "SELECT count(*) FROM " + `"` + l.schema + `"` + ".point_ledger"
			rows := func() int64 { return testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.point_ledger") }
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			produced := make(chan produceResult, 1)
			go func() {
				resent := func(o order) bool { return o.OrderID%10 < 3 }
				sends, err := produceOrders(ctx, client, urls, orders, resent, sqsKillWindow, func() (n int64, err error) {
					return n, l.db.QueryRowContext(ctx, count).Scan(&n)
				})
				produced <- produceResult{sends, err}
			}()
			var prod *produceResult
			spec := consumerSpec{Endpoint: endpoint, QueueURLs: urls, Schema: l.schema, Batch: batch}
			procs := []*consumerProc{startConsumerProc(t, spec), startConsumerProc(t, spec)}
			restarts := 0
			waitFor := func(timeout time.Duration, what string, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(timeout)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for !cond() {
					select {
					case r := <-produced:
						if r.err != nil {
							t.Fatalf("producer: %v", r.err)
						}
						prod = &r
					default:
					}
					for i, p := range procs {
						if p.exited() {
							if !p.staleDelete() {
								t.Fatalf("a consumer process exited on its own: %s", p.stderr.String())
							}
							restarts++
							procs[i] = startConsumerProc(t, spec)
						}
					}
					if time.Now().After(deadline) {
						t.Fatalf("after %v: still not %s (%d of %d orders applied)", timeout, what, rows(), n)
					}
					<-tick.C
				}
			}
			long := max(2*time.Minute, time.Duration(n)*200*time.Millisecond)
			kills := 0
			for round := int64(1); round <= 3; round++ {
				waitFor(long, "applied enough to kill", func() bool { return rows() >= round*int64(n)/4 })
				procs[0].kill(t) // a process that ended on its own is replaced below
				kills++
				procs = append(procs[1:], startConsumerProc(t, spec))
			}
			waitFor(long, "every order sent and applied and the queues empty", func() bool {
				if prod == nil || rows() < int64(n) {
					return false
				}
				for _, url := range urls {
					if queueDepth(t, client, url) != 0 {
						return false
					}
				}
				return true
			})
			var applied, dups, requeued int64
			for _, p := range procs {
				a, d, r := p.stop(t)
				applied, dups, requeued = applied+a, dups+d, requeued+r
			}
			claims := testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.processed_messages")
			t.Logf("%d sends of %d orders over %d queues, %d consumer processes SIGKILLed, %d restarted after a refused stale delete: %d ledger rows, %d claims; the %d processes that ran to the end applied %d, duplicates %d, requeued %d; %v",
				prod.sends, n, len(urls), kills, restarts, rows(), claims, len(procs), applied, dups, requeued, time.Since(start).Round(time.Second))
			testenv.AuditOrders(t, l.db, l.schema, orders)
		})
	}
}

const (
	// sqsKillQueues is how many queues TestSQSLoadWithDuplicatesAndKilledProcesses
	// spreads its orders over.
	sqsKillQueues = 4
	// sqsKillWindow is how many orders its producer sends ahead of those
	// applied.
	sqsKillWindow = 120
)

// produceResult is what produceOrders returned.
type produceResult struct {
	sends int
	err   error
}

// produceOrders sends orders with their keys and event times, each order
// for which twice is true twice (a producer's re-send), ten to a
// SendMessageBatch, the batches to the queues at urls in turn; before each
// batch it waits until no more than window of the orders sent so far are
// missing from applied's count. It returns how many messages it sent.
func produceOrders(ctx context.Context, client *sqs.Client, urls []string, orders []order, twice func(order) bool, window int, applied func() (int64, error)) (int, error) {
	at := adapter.FormatEventTime(time.Now())
	var entries []sqstypes.SendMessageBatchRequestEntry
	sends, batches := 0, 0
	flush := func(upTo int) error {
		for {
			n, err := applied()
			if err != nil {
				return err
			}
			if int64(upTo)-n <= int64(window) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond): // polling the ledger
			}
		}
		out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(urls[batches%len(urls)]), Entries: entries})
		if err != nil {
			return err
		}
		if len(out.Failed) > 0 {
			f := out.Failed[0]
			return fmt.Errorf("SendMessageBatch: %d of %d failed, the first %s: %s", len(out.Failed), len(entries), aws.ToString(f.Code), aws.ToString(f.Message))
		}
		sends += len(entries)
		batches++
		entries = entries[:0]
		return nil
	}
	for i, o := range orders {
		body, _ := json.Marshal(o)
		copies := 1
		if twice != nil && twice(o) {
			copies = 2
		}
		for range copies {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{
				Id:          aws.String(strconv.Itoa(len(entries))),
				MessageBody: aws.String(string(body)),
				MessageAttributes: map[string]sqstypes.MessageAttributeValue{
					cdkpubsub.DefaultKeyMetadata: {DataType: aws.String("String"), StringValue: aws.String(o.Key())},
					adapter.EventTimeHeader:      {DataType: aws.String("String"), StringValue: aws.String(at)},
				},
			})
			if len(entries) == 10 {
				if err := flush(i + 1); err != nil {
					return sends, err
				}
			}
		}
	}
	if len(entries) > 0 {
		if err := flush(len(orders)); err != nil {
			return sends, err
		}
	}
	return sends, nil
}
