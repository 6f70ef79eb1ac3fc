package ports

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeGivesDistinctListenablePorts: every port Free returns is
// distinct and can be listened on.
func TestFreeGivesDistinctListenablePorts(t *testing.T) {
	ps, err := Free(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] || p <= 0 {
			t.Fatalf("ports %v: %d repeated or not a port", ps, p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		_ = l.Close()
	}
}
