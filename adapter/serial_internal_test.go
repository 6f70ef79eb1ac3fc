package adapter

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSerialOneKeyAtATime: a second call with a key waits for the first to
// return, while a call with another key runs meanwhile; nothing is left
// behind once all returned.
func TestSerialOneKeyAtATime(t *testing.T) {
	var s Serial
	var mu sync.Mutex
	var log []string
	note := func(e string) {
		mu.Lock()
		log = append(log, e)
		mu.Unlock()
	}
	release := make(chan struct{})
	started := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.Do("a", func() {
			note("a1 start")
			close(started)
			<-release
			note("a1 end")
		})
	}()
	<-started
	go func() {
		defer wg.Done()
		s.Do("a", func() { note("a2") })
	}()
	// Wait until the second call of "a" is inside Do (bounded poll).
	deadline := time.Now().Add(time.Minute)
	for {
		s.mu.Lock()
		n := s.keys["a"].n
		s.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second call of key a never reached Do")
		}
		time.Sleep(time.Millisecond)
	}
	s.Do("b", func() { note("b") }) // another key: runs while a1 holds "a"
	close(release)
	wg.Wait()
	if want := []string{"a1 start", "b", "a1 end", "a2"}; !slices.Equal(log, want) {
		t.Errorf("calls ran as %q, want %q", log, want)
	}
	if len(s.keys) != 0 {
		t.Errorf("keys left behind: %v", s.keys)
	}
}
