package watermill_test

import "sync"

// once reports, per id, whether this is the first time it is asked.
type once struct {
	mu   sync.Mutex
	seen map[int64]bool
}

func newOnce() *once { return &once{seen: map[int64]bool{}} }

func (o *once) first(id int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[id] {
		return false
	}
	o.seen[id] = true
	return true
}
