package nats_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/postgres"
)

// The tests run against a real Postgres and real nats-server processes:
// IDEMPOTENT_POSTGRES_DSN (default the local server), IDEMPOTENT_NATS_URL
// (default the local server on 4222, JetStream enabled) and
// IDEMPOTENT_NATS_SERVER (default /usr/sbin/nats-server, or nats-server on
// PATH) for the clusters the tests start themselves. Without them the tests
// skip — except when CI is set, where they fail.

// ledger is the loyalty service on a schema of the test's own: claims,
// balances and a point ledger with one row per applied order.
type ledger struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

// order is the loyalty service's message.
type order = testenv.Order

// newLedger's opts are idempotent's options, after WithTable.
func newLedger(t testing.TB, db *sql.DB, consumer string, opts ...idempotent.Option) *ledger {
	t.Helper()
	schema := testenv.LoyaltySchema(t, db, "nats")
	mw, err := idempotent.New(db, postgres.New(), consumer, append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &ledger{db: db, schema: schema, mw: mw}
}

// credit is the effect: points on the balance and a ledger row, through tx.
func (l *ledger) credit(ctx context.Context, tx *sql.Tx, o order) error {
	return testenv.Credit(ctx, tx, l.schema, o)
}

// creditBatch credits several orders set-wise (testenv.CreditBatch).
func (l *ledger) creditBatch(ctx context.Context, tx *sql.Tx, orders []order) error {
	return testenv.CreditBatch(ctx, tx, l.schema, orders)
}

// handler is the per-message effect: the order decoded from the data,
// credited through tx.
func (l *ledger) handler() idnats.Handler {
	return idnats.Decode(idnats.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ jetstream.Msg) error {
		return l.credit(ctx, tx, o)
	})
}

// batchHandler is the batch effect: the orders decoded from the fresh
// messages' data, credited together through tx; a message whose data is
// not an order is named poison alone.
func (l *ledger) batchHandler() idnats.BatchHandler {
	return func(ctx context.Context, tx *sql.Tx, msgs []jetstream.Msg) error {
		orders, err := decodeOrders(msgs)
		if err != nil {
			return err
		}
		return l.creditBatch(ctx, tx, orders)
	}
}

// decodeOrders decodes the orders of msgs; a message that holds none is
// named with adapter.PoisonItem.
func decodeOrders(msgs []jetstream.Msg) ([]order, error) {
	orders := make([]order, len(msgs))
	for i, m := range msgs {
		o, err := idnats.JSON[order](m.Data())
		if err != nil {
			return nil, adapter.PoisonItem(i, err)
		}
		orders[i] = o
	}
	return orders, nil
}

// must returns the Consumer a constructor returned, failing the test on
// its error: must(t)(idnats.NewConsumer(…)).
func must(t testing.TB) func(c *idnats.Consumer, err error) *idnats.Consumer {
	return func(c *idnats.Consumer, err error) *idnats.Consumer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// events records a Consumer's events, in order: an adapter.Observer.
type events struct {
	mu  sync.Mutex
	all []adapter.Event
}

func (e *events) Observe(_ context.Context, ev adapter.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

// of returns the events of type typ.
func (e *events) of(typ adapter.EventType) []adapter.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []adapter.Event
	for _, ev := range e.all {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// settledAll is how many deliveries s counts as finished or handed back.
func settledAll(s adapter.Stats) int64 {
	return s.Applied + s.Duplicates + s.Requeued + s.DeadLettered + s.Released
}

// seq is the stream sequence of the delivery an event reports.
func seq(ev adapter.Event) uint64 {
	m, ok := ev.Detail.(jetstream.Msg)
	if !ok {
		return 0
	}
	md, err := m.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

func (l *ledger) count(t testing.TB, query string) int64 {
	t.Helper()
	return testenv.Count(t, l.db, l.schema, query)
}

// audit checks the effects are exactly those of the unique orders: one
// ledger row and one claim each, every balance exact.
func (l *ledger) audit(t testing.TB, orders []order) {
	t.Helper()
	testenv.AuditOrders(t, l.db, l.schema, orders)
}

// connect connects to urls (comma-separated), closed in Cleanup.
func connect(t testing.TB, urls string, opts ...natsgo.Option) *natsgo.Conn {
	t.Helper()
	opts = append([]natsgo.Option{natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := natsgo.Connect(urls, opts...)
	if err != nil {
		testenv.Unavailable(t, "no NATS server at %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// localNATS returns a connection to the machine's server.
func localNATS(t testing.TB) *natsgo.Conn {
	t.Helper()
	return connect(t, testenv.Getenv("IDEMPOTENT_NATS_URL", "nats://127.0.0.1:4222"), natsgo.MaxReconnects(0))
}

func newJS(t testing.TB, nc *natsgo.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// newStream creates a stream of the test's own on subject <name>.>, deleted
// in Cleanup.
func newStream(t testing.TB, js jetstream.JetStream, replicas int) (jetstream.Stream, string) {
	t.Helper()
	name := strings.ToUpper(testenv.UniqueName("T"))
	var s jetstream.Stream
	waitFor(t, 30*time.Second, "stream "+name, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Replicas: replicas, Storage: jetstream.FileStorage})
		return err == nil, nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return s, name
}

// newConsumer creates a durable pull consumer with AckExplicit.
func newConsumer(t testing.TB, s jetstream.Stream, durable string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// bindConsumer looks the durable up again on another connection.
func bindConsumer(t testing.TB, js jetstream.JetStream, stream, durable string) jetstream.Consumer {
	t.Helper()
	var c jetstream.Consumer
	waitFor(t, 30*time.Second, "consumer "+durable, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var err error
		c, err = js.Consumer(ctx, stream, durable)
		return err == nil, nil
	})
	return c
}

// publish publishes o to subject with the given Nats-Msg-Id, retrying until
// the stream acknowledges it (the id makes retries safe).
func publish(t testing.TB, js jetstream.JetStream, subject, msgID string, data []byte, hdr map[string]string) {
	t.Helper()
	m := natsgo.NewMsg(subject)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	waitFor(t, 60*time.Second, "PubAck of "+msgID, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.PublishMsg(ctx, m)
		return err == nil, nil
	})
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitFor polls cond every few milliseconds until it holds, failing the test
// after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pending returns the consumer's undelivered and unacknowledged counts.
func pending(t testing.TB, c jetstream.Consumer) (numPending uint64, ackPending int, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.NumPending, info.NumAckPending, nil
}

// running is a consumer process: a connection and a Run on it.
type running struct {
	nc     *natsgo.Conn
	cancel context.CancelFunc
	done   chan error
}

// start runs c on a new connection to urls and the durable of stream.
func start(t testing.TB, c *idnats.Consumer, urls, stream, durable string) *running {
	t.Helper()
	nc := connect(t, urls)
	cons := bindConsumer(t, newJS(t, nc), stream, durable)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, cons) }()
	return r
}

// stop shuts the process down gracefully and returns Run's result.
func (r *running) stop() error {
	r.cancel()
	err := <-r.done
	r.nc.Close()
	return err
}

// kill closes the connection under Run, as a crash does: acks in flight are
// lost, and the server redelivers those messages after AckWait.
func (r *running) kill() error {
	r.nc.Close()
	err := <-r.done
	r.cancel()
	return err
}

// hookedConsumer hands Run messages whose DoubleAck and InProgress go
// through hooks, when set: a test makes an ack fail, or counts heartbeats.
type hookedConsumer struct {
	jetstream.Consumer
	doubleAck  func(ctx context.Context, m jetstream.Msg) error
	inProgress func(m jetstream.Msg) error
}

func (h hookedConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := h.Consumer.Fetch(n, opts...)
	if err != nil {
		return b, err
	}
	out := hookedBatch{MessageBatch: b, msgs: make(chan jetstream.Msg)}
	go func() {
		defer close(out.msgs)
		for m := range b.Messages() {
			out.msgs <- hookedMsg{m, h}
		}
	}()
	return out, nil
}

type hookedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b hookedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type hookedMsg struct {
	jetstream.Msg
	h hookedConsumer
}

func (m hookedMsg) DoubleAck(ctx context.Context) error {
	if m.h.doubleAck != nil {
		return m.h.doubleAck(ctx, m.Msg)
	}
	return m.Msg.DoubleAck(ctx)
}

func (m hookedMsg) InProgress() error {
	if m.h.inProgress != nil {
		return m.h.inProgress(m.Msg)
	}
	return m.Msg.InProgress()
}

// --- a nats-server cluster of the test's own ---

// natsServer is one nats-server process.
type natsServer struct {
	name       string
	clientPort int
	httpPort   int
	conf       string
	cmd        *exec.Cmd
	exited     chan struct{}
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.clientPort) }

type cluster struct {
	servers []*natsServer
}

func (c *cluster) urls() string {
	var u []string
	for _, s := range c.servers {
		u = append(u, s.url())
	}
	return strings.Join(u, ",")
}

func (c *cluster) byName(name string) *natsServer {
	for _, s := range c.servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

func natsServerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("IDEMPOTENT_NATS_SERVER"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server"
	}
	p, err := exec.LookPath("nats-server")
	if err != nil {
		testenv.Unavailable(t, "no nats-server binary (set IDEMPOTENT_NATS_SERVER, or install the nats-server package)")
	}
	return p
}

// startCluster starts n nats-servers with JetStream as one cluster on free
// loopback ports, each with its own store under t.TempDir(), and waits until
// every one reports healthy with JetStream. They are killed in Cleanup.
func startCluster(t testing.TB, n int) *cluster {
	t.Helper()
	natsServerBinary(t) // skips early when there is none
	ports := freePorts(t, 3*n)
	dir := t.TempDir()
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+2]))
	}
	c := &cluster{}
	clusterName := testenv.UniqueName("C")
	for i := range n {
		s := &natsServer{name: fmt.Sprintf("n%d", i+1), clientPort: ports[3*i], httpPort: ports[3*i+1]}
		store := filepath.Join(dir, s.name)
		s.conf = filepath.Join(dir, s.name+".conf")
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream { store_dir: %q, max_memory_store: 64MB, max_file_store: 1GB }
cluster { name: %s, listen: 127.0.0.1:%d, routes: [%s] }
`, s.name, s.clientPort, s.httpPort, store, clusterName, ports[3*i+2], strings.Join(routes, ", "))
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		s.start(t, dir)
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			s.kill()
		}
	})
	for _, s := range c.servers {
		s.waitHealthy(t)
	}
	return c
}

func (s *natsServer) start(t testing.TB, dir string) {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, s.name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(natsServerBinary(t), "-c", s.conf)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		_ = log.Close()
		close(s.exited)
	}()
}

// waitHealthy polls the monitoring port's /healthz until JetStream is
// ready.
func (s *natsServer) waitHealthy(t testing.TB) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	waitFor(t, 60*time.Second, s.name+" /healthz", func() (bool, error) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("%s exited (see its log in the test's temp dir)", s.name)
		default:
		}
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.httpPort))
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		var body struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode == http.StatusOK && body.Status == "ok", nil
	})
}

// kill sends SIGKILL and waits for the process to exit.
func (s *natsServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// streamLeader returns the name of the stream's current leader.
func streamLeader(t testing.TB, js jetstream.JetStream, stream string) string {
	t.Helper()
	var leader string
	waitFor(t, 30*time.Second, "a leader of "+stream, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return false, nil
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false, nil
		}
		leader = info.Cluster.Leader
		return true, nil
	})
	return leader
}
