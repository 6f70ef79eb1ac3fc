package mqtt_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
)

// ownBroker is a Mosquitto of the test's own, on a free loopback port, with
// persistence on in a temporary directory, which the test may restart.
type ownBroker struct {
	t    *testing.T
	bin  string
	conf string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

func startOwnBroker(t *testing.T) *ownBroker {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr != nil {
			testenv.Unavailable(t, "no mosquitto binary (apt-get install mosquitto): %v", err)
		}
		bin = "/usr/sbin/mosquitto"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nuser root\n", port, dir)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &ownBroker{t: t, bin: bin, conf: conf, addr: "127.0.0.1:" + strconv.Itoa(port)}
	b.start()
	t.Cleanup(b.stop)
	return b
}

// start runs the broker and waits, at most 30s, for it to listen.
func (b *ownBroker) start() {
	b.t.Helper()
	b.cmd = exec.Command(b.bin, "-c", b.conf)
	if err := b.cmd.Start(); err != nil {
		b.t.Fatalf("start mosquitto: %v", err)
	}
	b.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(b.cmd, b.done)
	for range 300 { // a bounded wait for a server starting
		if c, err := net.DialTimeout("tcp", b.addr, time.Second); err == nil {
			_ = c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.t.Fatalf("mosquitto did not listen on %s within 30s", b.addr)
}

// stop ends the broker with SIGTERM — it writes its persistence file — and
// waits for it to exit.
func (b *ownBroker) stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(os.Interrupt)
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
}

// Mosquitto restarted, with persistence on, while a consumer works through
// 300 orders (90 of them published twice), the second half published after
// the restart: the consumer dials again and resumes its session, which the
// broker kept on disk with the messages not yet acknowledged — among them
// order 150, committed while the broker was down, which comes again as a
// Duplicate; every order is applied exactly once.
func TestBrokerRestartedMidRun(t *testing.T) {
	t.Parallel()
	b := startOwnBroker(t)
	l := newLedger(t)
	rec := testenv.NewRecorder()
	topic := "idempotent/" + testenv.UniqueName("restart")
	clientID := testenv.UniqueName("restart")
	const qos = 1
	openSession(t, b.addr, clientID, topic, qos)
	orders := testenv.MakeOrders(300)
	sends := 0
	publishAll := func(part []order) {
		pub := connect(t, b.addr, testenv.UniqueName("pub"), 0)
		for _, o := range part {
			sendOrder(t, pub, topic, qos, o)
			sends++
			if o.OrderID%10 < 3 {
				sendOrder(t, pub, topic, qos, o) // a producer's re-send
				sends++
			}
		}
		_ = pub.Disconnect(&paho.Disconnect{})
	}
	publishAll(orders[:150])
	// The handler of order 150 holds its claim until the broker has been
	// restarted, so that the restart falls mid-run: what follows it is
	// delivered only on a connection to the restarted broker.
	holding, restarted := make(chan struct{}), make(chan struct{})
	var once sync.Once
	credit := l.handler()
	c, err := mqtt.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *paho.Publish) error {
		if k, _ := mqtt.Property(mqtt.DefaultKeyProperty)(m); k == orders[149].Key() {
			once.Do(func() {
				close(holding)
				<-restarted
			})
		}
		return credit(ctx, tx, m)
	}, mqtt.WithObserver(rec), mqtt.WithWorkers(2),
		mqtt.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p := startProc(c, b.addr, clientID, topic, qos)
	select {
	case <-holding:
	case <-time.After(60 * time.Second):
		t.Fatal("order 150 never reached its handler")
	}
	b.stop()
	b.start()
	close(restarted)
	// Published to the restarted broker: they reach the consumer only if
	// the broker kept its session (persistence) and the consumer resumed
	// it on a new connection.
	publishAll(orders[150:])
	rec.Until(t, 120*time.Second, "applied every order after the restart", func() bool { return rec.Sum(adapter.EventApplied) >= len(orders) })
	p.stop(t)
	if n := rec.Sum(adapter.EventApplied); n != len(orders) {
		t.Errorf("%d Applied, want %d", n, len(orders))
	}
	rec.Until(t, 60*time.Second, "order 150, committed while the broker was down, delivered again as a Duplicate", func() bool {
		return rec.Count(adapter.EventDuplicate, orders[149].Key()) >= 1
	})
	s := c.Stats()
	t.Logf("%d sends of %d orders, Mosquitto restarted once: applied %d, duplicates %d, released %d, connections lost or refused %d",
		sends, len(orders), s.Applied, s.Duplicates, s.Released, rec.Sum(adapter.EventFetchError))
	testenv.AuditOrders(t, l.db, l.schema, orders)
}
