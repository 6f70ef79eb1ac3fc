package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// ackProxy sits between one lane's consumers and the server, on a Unix
// socket of its own, and passes the PostgreSQL wire protocol through
// untouched — except that, when armed, it lets the next COMMIT reach the
// server, waits for the server to confirm it, and then cuts the connection
// instead of passing the confirmation on. The consumer is left with a
// COMMIT whose outcome it cannot know and which did land: the one case a
// pg_terminate_backend cannot produce on purpose.
type ackProxy struct {
	dir      string                 // holds the socket .s.PGSQL.<port>
	port     int                    // the port in the socket's name, as the consumers' DSN gives it
	upstream atomic.Pointer[string] // the primary's socket
	ln       net.Listener
	armed    atomic.Bool
	fired    chan bool // one value per armed cut: whether the COMMIT landed

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startAckProxy listens in dir on the socket lib/pq looks for at port, and
// forwards to the cluster's socket.
func startAckProxy(dir string, c *pgcluster.Cluster) (*ackProxy, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	name := ".s.PGSQL." + strconv.Itoa(c.Port)
	ln, err := net.Listen("unix", filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("ack proxy: %w", err)
	}
	p := &ackProxy{
		dir: dir, port: c.Port, ln: ln,
		fired: make(chan bool, 1), conns: map[net.Conn]struct{}{},
	}
	p.retarget(c)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// retarget sends new connections to c's socket, as a virtual IP or a DNS
// name moved by an orchestrator after a failover would. Connections already
// relayed stay where they are.
func (p *ackProxy) retarget(c *pgcluster.Cluster) {
	up := filepath.Join(c.Dir, ".s.PGSQL."+strconv.Itoa(c.Port))
	p.upstream.Store(&up)
}

// dsn is a DSN with the proxy's socket directory as host.
func (p *ackProxy) dsn(app string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5 application_name=%s", p.dir, p.port, app)
}

// cutNextCommitAck arms the proxy and waits up to within for a COMMIT to go
// through it. It reports whether a COMMIT landed and its confirmation was
// cut off.
func (p *ackProxy) cutNextCommitAck(within time.Duration) bool {
	select {
	case <-p.fired: // a stale result from an earlier, timed-out arming
	default:
	}
	p.armed.Store(true)
	select {
	case landed := <-p.fired:
		return landed
	case <-time.After(within):
		if p.armed.CompareAndSwap(true, false) {
			return false
		}
		return <-p.fired // it fired just now
	}
}

func (p *ackProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *ackProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *ackProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

// handle relays one client connection.
func (p *ackProxy) handle(client net.Conn) {
	server, err := net.Dial("unix", *p.upstream.Load())
	if err != nil {
		_ = client.Close() // the server is down: the client sees a lost connection
		return
	}
	p.track(client, server)
	defer p.untrack(client, server)

	var cutting atomic.Bool // set once an armed COMMIT has been sent
	landed := make(chan bool, 1)
	go func() {
		// Server to client: every message is typed.
		defer func() { _ = client.Close(); _ = server.Close() }()
		for {
			typ, msg, err := readTyped(server)
			if err != nil {
				if cutting.Load() {
					landed <- false
				}
				return
			}
			if cutting.Load() {
				switch typ {
				case 'C': // "COMMIT", or "ROLLBACK" if the transaction had failed
					landed <- bytes.HasPrefix(msg[5:], []byte("COMMIT"))
					return
				case 'E':
					landed <- false
					return
				}
				continue // notices and the like: dropped too
			}
			if _, err := client.Write(msg); err != nil {
				return
			}
		}
	}()

	// Client to server: the first message (startup or cancel request) has
	// no type byte; every later one does.
	first, err := readUntyped(client)
	if err != nil {
		return
	}
	if _, err := server.Write(first); err != nil {
		return
	}
	for {
		typ, msg, err := readTyped(client)
		if err != nil {
			return
		}
		if typ == 'Q' && isCommit(msg[5:]) && p.armed.CompareAndSwap(true, false) {
			cutting.Store(true)
			if _, err := server.Write(msg); err != nil {
				p.fired <- false
				return
			}
			select {
			case ok := <-landed:
				p.fired <- ok
			case <-time.After(30 * time.Second):
				p.fired <- false
			}
			return
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}

func isCommit(query []byte) bool {
	q := bytes.ToUpper(bytes.TrimSpace(bytes.TrimRight(query, "\x00")))
	return bytes.Equal(q, []byte("COMMIT")) || bytes.Equal(q, []byte("END"))
}

// readTyped reads one typed protocol message and returns its type and the
// whole message, header included.
func readTyped(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 1<<30 {
		return 0, nil, errors.New("ack proxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return 0, nil, err
	}
	return hdr[0], msg, nil
}

// readUntyped reads the length-prefixed first message of a connection.
func readUntyped(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > 10000 {
		return nil, errors.New("ack proxy: bad startup length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// close stops listening, cuts every relayed connection and waits for the
// relays to end.
func (p *ackProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
