package main

import (
	"fmt"
	"time"
)

// progressLine is one line of the run so far: the orders and deliveries
// published, the deliveries the consumers have reported, and the faults
// injected (and missed: found no target).
func (s *soak) progressLine(elapsed time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var orders, deliveries, processed, dups int64
	for _, l := range lanes {
		orders += s.stats[l.name].orders.Load()
		deliveries += s.stats[l.name].deliveries.Load()
	}
	for _, r := range s.reports {
		processed += r.Applied + r.Duplicates + r.Failed
		dups += r.Duplicates
	}
	var faults, missed int
	for _, byLane := range s.faults {
		for _, n := range byLane {
			faults += n
		}
	}
	for _, n := range s.missed {
		missed += n
	}
	return fmt.Sprintf("soak: %v of %v: %d orders in %d deliveries published, %d processed (%d duplicates), %d faults injected, %d missed",
		elapsed.Round(time.Second), s.cfg.Duration, orders, deliveries, processed, dups, faults, missed)
}

// reportProgress prints progressLine every s.cfg.Progress until stop is
// closed, so that a long run is not minutes of silence.
func (s *soak) reportProgress(start time.Time, stop <-chan struct{}) {
	if s.cfg.Progress <= 0 {
		return
	}
	t := time.NewTicker(s.cfg.Progress)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fmt.Fprintln(s.out, s.progressLine(time.Since(start)))
		}
	}
}
