package latencyproxy

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestProxyDelays echoes through the proxy and checks that the bytes come
// back whole and no sooner than one delay each way.
func TestProxyDelays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	const d = 20 * time.Millisecond
	p, err := Start(ln.Addr().String(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); string(buf) != "ping" || took < 2*d {
		t.Errorf("echo %q after %v; want \"ping\" after at least %v", buf, took, 2*d)
	}
}

func TestDSN(t *testing.T) {
	got, p, err := DSN("postgres://u@127.0.0.1:5432/db?sslmode=disable", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if want := "postgres://u@" + p.Addr() + "/db?sslmode=disable"; got != want {
		t.Errorf("DSN = %q, want %q", got, want)
	}
	if _, _, err := DSN("host=h dbname=db", time.Millisecond); err == nil || !strings.Contains(err.Error(), "URL") {
		t.Errorf("keyword DSN: err %v, want one asking for a URL", err)
	}
	if _, err := Start("127.0.0.1:1", -time.Second); err == nil {
		t.Error("negative delay: no error")
	}
}
