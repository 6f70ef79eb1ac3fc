package kafkabench

import "testing"

// TestWindow feeds the head-to-head counter a known interleaving: side 0
// applies two records for every one of side 1's. The window opens when both
// have a tenth (10 of 100) and closes when either has nine tenths (90).
func TestWindow(t *testing.T) {
	w := &window{lo: 10, hi: 90}
	for w.phase != 2 {
		w.add(0)
		w.add(0)
		w.add(1)
	}
	// Side 1 reaches 10 when side 0 has 20; side 0 reaches 90 when side 1
	// has 44 (after side 0's 89th and 90th).
	if w.start != [2]int64{20, 10} || w.end != [2]int64{90, 44} {
		t.Errorf("window %v → %v, want [20 10] → [90 44]", w.start, w.end)
	}
	w.add(1)
	if w.end != [2]int64{90, 44} {
		t.Errorf("window moved after it closed: end %v", w.end)
	}
}
