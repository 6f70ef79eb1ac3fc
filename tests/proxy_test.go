package tests

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// commitCutter is a TCP proxy in front of Postgres that forwards the wire
// protocol unchanged, except that, once armed, it cuts the client and server
// connections at the moment the server reports that a COMMIT completed,
// before the client sees it. The commit has then landed on the server but the
// client cannot know: the ambiguous commit.
type commitCutter struct {
	ln       net.Listener
	upstream string
	armed    atomic.Bool
	cut      atomic.Int32 // how many commits were cut
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// newCommitCutter starts a proxy to upstream (host:port), closed in Cleanup.
func newCommitCutter(t testing.TB, upstream string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *commitCutter) Addr() string { return p.ln.Addr().String() }

// Arm makes the proxy cut the next COMMIT's completion, once.
func (p *commitCutter) Arm() { p.armed.Store(true) }

func (p *commitCutter) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *commitCutter) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *commitCutter) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.track(client)
		p.track(server)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(server, client)
			_ = server.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.serverToClient(server, client)
			_ = client.Close()
			_ = server.Close()
		}()
	}
}

// serverToClient forwards backend messages one at a time: a type byte, a
// big-endian int32 length that counts itself, the body. With sslmode=disable
// the server sends nothing else.
func (p *commitCutter) serverToClient(server, client net.Conn) {
	r := bufio.NewReader(server)
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		// CommandComplete with tag "COMMIT": the transaction is durable on
		// the server. Drop the message and both connections.
		if head[0] == 'C' && bytes.Equal(body, []byte("COMMIT\x00")) && p.armed.CompareAndSwap(true, false) {
			p.cut.Add(1)
			_ = client.Close()
			_ = server.Close()
			return
		}
		if _, err := client.Write(append(head, body...)); err != nil {
			return
		}
	}
}
