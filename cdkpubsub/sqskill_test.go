package cdkpubsub_test

import (
	"bufio"
	"bytes"
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

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"gocloud.dev/pubsub/awssnssqs"

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
	Endpoint, QueueURL, Schema string
	Batch                      bool
}

// runSQSConsumer is a consumer process: a Consumer on the SQS queue of
// spec, crediting the ledger of spec's schema, until SIGTERM (then it
// shuts its Subscription down, which sends the pending deletes, and prints
// its Stats) or SIGKILL. It prints "running" once Run has started.
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
	opts := []cdkpubsub.Option{cdkpubsub.WithWorkers(4), cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
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
	sub := awssnssqs.OpenSubscriptionV2(ctx, sqsClientAt(s.Endpoint, nil), s.QueueURL, &awssnssqs.SubscriptionOptions{Raw: true})
	fmt.Println("running")
	runErr := c.Run(ctx, sub)
	shutErr := sub.Shutdown(context.Background())
	st := c.Stats()
	fmt.Printf("stats %d %d %d\n", st.Applied, st.Duplicates, st.Requeued)
	if runErr != nil || shutErr != nil {
		fmt.Fprintln(os.Stderr, "Run:", runErr, "Shutdown:", shutErr)
		return 1
	}
	return 0
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

// Orders sent to a standard SQS queue, 30% of them twice (a producer's
// re-send), consumed by two consumer processes — subprocesses of the test
// binary — of which one is SIGKILLed and replaced three times mid-stream:
// what a killed process had received and not deleted (handlers running,
// commits in flight, deletes not yet sent) comes again after the
// visibility timeout (two seconds; thirty above 300 orders) to the others. Every order is applied exactly once,
// and the balances are exact.
//
// A delivery that waited in the Subscription's buffer past the visibility
// timeout is received again by another process, which deletes it; moto
// then refuses the first delivery's delete (ReceiptHandleIsInvalid), and
// awssnssqs makes a failed batch of deletes the Subscription's error,
// which ends Run. Such a process is restarted, as a supervisor would, and
// counted; its late delete loses nothing, the message being gone. The
// default is 150 orders; set
// IDEMPOTENT_SQS_KILL_ORDERS=3000 for the full audit.
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
	for _, batch := range []bool{false, true} {
		name := "per-message"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := newSQSClient(t, nil)
			// Two seconds makes a killed process's messages come back soon;
			// a large run keeps them longer, so that what waits in a
			// Subscription's buffer behind thousands of others is not
			// received again by every process in turn.
			visibility := "2"
			if n > 300 {
				visibility = "30"
			}
			url := createQueue(t, client, false, map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): visibility})
			l := newLedger(t)
			orders := testenv.MakeOrders(n)
			sends := publishOrders(t, client, url, orders)
			spec := consumerSpec{Endpoint: sqsURL(t), QueueURL: url, Schema: l.schema, Batch: batch}
			rows := func() int64 { return testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.point_ledger") }
			procs := []*consumerProc{startConsumerProc(t, spec), startConsumerProc(t, spec)}
			restarts := 0
			waitFor := func(timeout time.Duration, what string, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(timeout)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for !cond() {
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
			long := max(2*time.Minute, time.Duration(n)*100*time.Millisecond)
			kills := 0
			for round := int64(1); round <= 3; round++ {
				waitFor(long, "applied enough to kill", func() bool { return rows() >= round*int64(n)/4 })
				procs[0].kill(t) // a process that ended on its own is replaced below
				kills++
				procs = append(procs[1:], startConsumerProc(t, spec))
			}
			waitFor(long, "every order applied and the queue empty", func() bool {
				return rows() >= int64(n) && queueDepth(t, client, url) == 0
			})
			var applied, dups, requeued int64
			for _, p := range procs {
				a, d, r := p.stop(t)
				applied, dups, requeued = applied+a, dups+d, requeued+r
			}
			claims := testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.processed_messages")
			t.Logf("%d sends of %d orders, %d consumer processes SIGKILLed, %d restarted after a refused stale delete: %d ledger rows, %d claims; the %d processes that ran to the end applied %d, duplicates %d, requeued %d",
				sends, n, kills, restarts, rows(), claims, len(procs), applied, dups, requeued)
			testenv.AuditOrders(t, l.db, l.schema, orders)
		})
	}
}

// publishOrders sends orders to the queue at url with their keys and
// event times, each order with OrderID%10 < 3 twice, from 8 goroutines
// (awssnssqs batches concurrent sends), and returns how many it sent.
func publishOrders(t *testing.T, client *sqs.Client, url string, orders []order) int {
	t.Helper()
	topic := awssnssqs.OpenSQSTopicV2(context.Background(), client, url, nil)
	defer func() { _ = topic.Shutdown(context.Background()) }()
	at := map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}
	var sends []order
	for _, o := range orders {
		sends = append(sends, o)
		if o.OrderID%10 < 3 {
			sends = append(sends, o) // a producer's re-send
		}
	}
	work := make(chan order)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				body, _ := json.Marshal(o)
				if err := sqsSend(context.Background(), topic, o.Key(), at, body, "", ""); err != nil {
					select {
					case errs <- err:
					default: // the first few are enough
					}
				}
			}
		}()
	}
	for _, o := range sends {
		work <- o
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("send: %v", err)
	}
	return len(sends)
}
