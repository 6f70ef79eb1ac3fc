package main

import (
	"testing"
	"time"
)

// The progress line counts both lanes' orders, every consumer's reports and
// every fault so far.
func TestProgressLine(t *testing.T) {
	s := &soak{
		cfg:     soakConfig{Duration: time.Minute},
		stats:   map[string]*laneStats{},
		reports: map[string]report{"a": {Applied: 10, Duplicates: 3, Failed: 1}, "b": {Applied: 5, Duplicates: 2}},
		faults:  map[string]map[string]int{faultKillHandler: {"read_committed": 2, "serializable": 1}, faultRestart: {"": 1}},
		missed:  map[string]int{faultSigkill: 1},
	}
	for i, l := range lanes {
		s.stats[l.name] = &laneStats{}
		s.stats[l.name].orders.Add(int64(100 * (i + 1)))
		s.stats[l.name].deliveries.Add(int64(130 * (i + 1)))
	}
	got := s.progressLine(15*time.Second + 400*time.Millisecond)
	want := "soak: 15s of 1m0s: 300 orders in 390 deliveries published, 21 processed (5 duplicates), 4 faults injected, 1 missed"
	if got != want {
		t.Errorf("progressLine:\n got %q\nwant %q", got, want)
	}
}
