package idempotent

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestBackoffBounds checks each sleep lies in the upper half of its nominal
// value, InitialBackoff doubled per attempt and capped at MaxBackoff — also
// for policies whose doubling would overflow a time.Duration.
func TestBackoffBounds(t *testing.T) {
	cases := []struct {
		name string
		p    RetryPolicy
	}{
		{"default", DefaultRetryPolicy()},
		{"no backoff", RetryPolicy{MaxAttempts: 5}},
		{"one nanosecond", RetryPolicy{MaxAttempts: 5, InitialBackoff: 1, MaxBackoff: 1}},
		{"two nanoseconds", RetryPolicy{MaxAttempts: 5, InitialBackoff: 2, MaxBackoff: 3}},
		{"constant", RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second, MaxBackoff: time.Second}},
		{"uncapped", RetryPolicy{MaxAttempts: 200, InitialBackoff: 5 * time.Millisecond, MaxBackoff: math.MaxInt64}},
		{"huge", RetryPolicy{MaxAttempts: 200, InitialBackoff: 1 << 62, MaxBackoff: math.MaxInt64}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, attempt := range []int{1, 2, 3, 10, 40, 41, 42, 63, 64, 100, 199} {
				nominal := c.p.InitialBackoff
				for i := 1; i < attempt && nominal < c.p.MaxBackoff; i++ {
					if nominal > c.p.MaxBackoff/2 {
						nominal = c.p.MaxBackoff
						break
					}
					nominal *= 2
				}
				low := nominal / 2
				if nominal <= 1 {
					low = nominal
				}
				seen := map[time.Duration]bool{}
				for range 50 {
					d := c.p.Backoff(attempt)
					if d < low || d > nominal {
						t.Fatalf("attempt %d: backoff %v, want within [%v, %v]", attempt, d, low, nominal)
					}
					seen[d] = true
				}
				if nominal >= time.Millisecond && len(seen) < 2 {
					t.Fatalf("attempt %d: 50 backoffs all %v: no jitter", attempt, nominal)
				}
			}
		})
	}
}

func TestSleepEndsWithContextWhenNotWaiting(t *testing.T) {
	if err := sleep(context.Background(), 0); err != nil {
		t.Fatalf("sleep(0) with a live context: %v", err)
	}
}
