package loyaltyload

import (
	"sync/atomic"
	"testing"
)

// TestGenHot checks that a schema's hot share sends that share of the
// messages to its first HotCustomers customers, and none without it.
func TestGenHot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hot      float64
		min, max int // messages of 10,000 on customers 1..5
	}{
		{"uniform", 0, 0, 5},
		{"hot 10%", 0.1, 900, 1100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var next atomic.Int64
			g := NewGen(&Schema{Customers: 100000, Hot: tc.hot, HotCustomers: 5}, &next, 1)
			n := 0
			for range 10000 {
				m := g.Next()
				if m.CustomerID < 1 || m.CustomerID > 100000 {
					t.Fatalf("customer %d out of 1..100000", m.CustomerID)
				}
				if m.CustomerID <= 5 {
					n++
				}
			}
			if n < tc.min || n > tc.max {
				t.Errorf("%d of 10000 messages on customers 1..5, want %d to %d", n, tc.min, tc.max)
			}
		})
	}
}
