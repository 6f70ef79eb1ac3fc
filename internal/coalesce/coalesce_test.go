package coalesce

import (
	"fmt"
	"testing"
	"time"
)

// TestOrderPartitioned: in partitioned mode a key given again with another
// event day goes alone, and so does every later member of that day — each
// is judged against the key's member kept in the group, not against the one
// sent away before it.
func TestOrderPartitioned(t *testing.T) {
	day1 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	day2 := day1.Add(24 * time.Hour)
	mk := func(key string, at time.Time) *Member[struct{}, int] {
		return &Member[struct{}, int]{Key: key, At: at, in: make(chan turn[struct{}, int], 1)}
	}
	members := []*Member[struct{}, int]{mk("k", day1), mk("k", day2), mk("k", day2), mk("j", day2), mk("k", day1.Add(time.Hour))}
	all := append([]*Member[struct{}, int](nil), members...)
	live := Order(members, true)
	var got []string
	for _, mb := range live {
		got = append(got, mb.Key+"@"+mb.At.Format("02T15"))
	}
	if want := "[j@02T10 k@01T10 k@01T11]"; fmt.Sprint(got) != want {
		t.Errorf("kept %v, want %s", got, want)
	}
	for i, mb := range all {
		alone := len(mb.in) == 1 && (<-mb.in).word.Alone
		if wantAlone := i == 1 || i == 2; alone != wantAlone {
			t.Errorf("member %d (%s@%s): sent alone %v, want %v", i, mb.Key, mb.At.Format("02T15"), alone, wantAlone)
		}
	}
	if n := len(Order([]*Member[struct{}, int]{mk("k", day1), mk("k", day2)}, false)); n != 2 {
		t.Errorf("not partitioned: kept %d of 2", n)
	}
}
