package mqtt_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/postgres"
)

// consumerEnv, set in a subprocess of the test binary, makes it a consumer
// process (runConsumer) instead of running tests.
const consumerEnv = "MQTT_TEST_CONSUMER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(consumerEnv); spec != "" {
		os.Exit(runConsumer(spec))
	}
	os.Exit(m.Run())
}

// consumerSpec is the session a consumer subprocess resumes, and the
// ledger it credits.
type consumerSpec struct {
	Addr, ClientID, Filter, Schema string
	QoS                            byte
}

// runConsumer is a consumer process on the session of spec whose
// acknowledgements never leave it: its connection's writes are muted once
// a handler has credited an order, so the PUBACK (QoS 1) or PUBREC (QoS 2)
// that follows the commit goes nowhere. It prints "running", and runs
// until it is killed.
func runConsumer(spec string) int {
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
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(s.Schema+".processed_messages"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l := &ledger{db: db, schema: s.Schema, mw: mw}
	var conn *muteConn
	credit := l.handler()
	c, err := mqtt.NewConsumer(mw, func(ctx context.Context, tx *sql.Tx, m *paho.Publish) error {
		err := credit(ctx, tx, m)
		conn.muted.Store(true)
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	dial := func(ctx context.Context) (net.Conn, error) {
		if conn != nil {
			return nil, net.ErrClosed // one connection: the test kills the process long before it would dial again
		}
		nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", s.Addr)
		if err != nil {
			return nil, err
		}
		conn = &muteConn{Conn: nc}
		return conn, nil
	}
	fmt.Println("running")
	if err := c.Run(ctx, mqtt.Session{Dial: dial, ClientID: s.ClientID, Filters: []string{s.Filter}, QoS: s.QoS, SessionExpiry: 10 * time.Minute}); err != nil {
		fmt.Fprintln(os.Stderr, "Run:", err)
		return 1
	}
	return 0
}

// A consumer process — a subprocess of the test binary — commits an
// order's credit and is SIGKILLed before its PUBACK (QoS 1) or PUBREC
// (QoS 2), a lost acknowledgement, reaches the broker: the broker sends
// the message again when the session is resumed, by another process, where
// the claim finds it: a Duplicate, one effect.
func TestSIGKILLedAfterCommitBeforeAck(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test")
	}
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("QoS%d", qos), func(t *testing.T) {
			t.Parallel()
			addr := brokerAddr(t)
			l := newLedger(t)
			topic := "idempotent/" + testenv.UniqueName("sigkill")
			clientID := testenv.UniqueName("sigkill")
			openSession(t, addr, clientID, topic, qos)
			pub := connect(t, addr, testenv.UniqueName("pub"), 0)
			o := order{OrderID: 9, CustomerID: 4, Points: 23}
			sendOrder(t, pub, topic, qos, o)

			spec, _ := json.Marshal(consumerSpec{Addr: addr, ClientID: clientID, Filter: topic, Schema: l.schema, QoS: qos})
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), consumerEnv+"="+string(spec))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() {
				_, _ = io.Copy(io.Discard, out)
				_ = cmd.Wait()
				close(exited)
			}()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
			rows := func() int64 { return testenv.Count(t, l.db, l.schema, "SELECT count(*) FROM $S.point_ledger") }
			deadline := time.Now().Add(60 * time.Second)
			for rows() == 0 { // until the subprocess's transaction committed
				select {
				case <-exited:
					t.Fatalf("the consumer process exited: %s", stderr.String())
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("the consumer process committed nothing within 60s")
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-exited

			rec := testenv.NewRecorder()
			c, err := mqtt.NewConsumer(l.mw, l.handler(), mqtt.WithObserver(rec))
			if err != nil {
				t.Fatal(err)
			}
			second := startProc(c, addr, clientID, topic, qos)
			rec.Until(t, 60*time.Second, "delivered again on the resumed session, a Duplicate", func() bool {
				return rec.Count(adapter.EventDuplicate, o.Key()) == 1
			})
			second.stop(t)
			if n := rec.Count(adapter.EventApplied, o.Key()); n != 0 {
				t.Errorf("%d Applied after the kill, want 0: the killed process had committed it", n)
			}
			testenv.AuditOrders(t, l.db, l.schema, []order{o})
		})
	}
}
