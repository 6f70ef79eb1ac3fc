package kafka

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCheckLog: the stored offset is checked against each branch of a fetch
// that shows the log no longer continues from it, and a first record above
// the stored offset (transaction markers, aborted records, compaction) is
// not a gap by itself.
func TestCheckLog(t *testing.T) {
	p := tp{"orders", 3}
	fetch := func(first, logStart, hw int64, id string) *partFetch {
		return &partFetch{recs: []*kgo.Record{{Offset: first}}, topicID: id, logStart: logStart, firstHW: hw, hw: hw}
	}
	for _, c := range []struct {
		name string
		st   partState
		f    *partFetch
		want string // "" for no gap
	}{
		{"continues", partState{stored: 10, topicID: "A"}, fetch(10, 0, 20, "A"), ""},
		{"marker or compaction above the stored offset", partState{stored: 10, topicID: "A"}, fetch(13, 5, 20, "A"), ""},
		{"nothing stored", partState{stored: -1}, fetch(0, 7, 20, "B"), ""},
		{"no topic ID stored yet", partState{stored: 10}, fetch(10, 0, 20, "B"), ""},
		{"no topic ID fetched", partState{stored: 10, topicID: "A"}, fetch(10, 0, 20, ""), ""},
		{"unknown bounds", partState{stored: 10, topicID: "A"}, fetch(10, -1, -1, "A"), ""},
		{"re-created", partState{stored: 10, topicID: "A"}, fetch(10, 0, 20, "B"), "deleted and re-created (its topic ID is B, the stored offset was written for A)"},
		{"records deleted", partState{stored: 10, topicID: "A"}, fetch(14, 14, 20, "A"), "the log starts at 14: records 10 to 13 were deleted"},
		{"log ends below", partState{stored: 10, topicID: "A"}, fetch(3, 0, 4, "A"), "the log ends at 4: it moved backwards"},
		{"first record below", partState{stored: 10, topicID: "A"}, fetch(7, 0, 12, "A"), "the first record fetched is at 7: the log moved backwards"},
	} {
		t.Run(c.name, func(t *testing.T) {
			gap := checkLog(p, c.st, c.f)
			if c.want == "" {
				if gap != nil {
					t.Fatalf("checkLog = %v, want no gap", gap)
				}
				return
			}
			if gap == nil {
				t.Fatalf("checkLog found no gap, want %q", c.want)
			}
			msg := gap.Error()
			if !strings.Contains(msg, c.want) || !strings.Contains(msg, `topic "orders" partition 3: stored offset 10`) || !errors.Is(gap, ErrLogGap) {
				t.Fatalf("checkLog = %q, want it to name the partition, the stored offset and %q, and match ErrLogGap", msg, c.want)
			}
		})
	}
	cause := errors.New("client says so")
	if gap := (&LogGapError{Topic: "t", Stored: 4, LogStart: -1, HighWatermark: -1, First: -1, Err: cause}); !errors.Is(gap, cause) || !errors.Is(gap, ErrLogGap) || !strings.Contains(gap.Error(), "client says so") {
		t.Fatalf("%v: want it to match ErrLogGap and the client's error and say it", gap)
	}
}
