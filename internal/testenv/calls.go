package testenv

import (
	"sync"
	"testing"

	"github.com/txclaim/idempotent"
)

// Call is the result of one of CallAll's calls: its outcome, its error or
// its panic, and Tx, what its handler recorded of the transaction it last
// ran in (a *sql.Tx, a transaction id).
type Call[T comparable] struct {
	Outcome  idempotent.Outcome
	Err      error
	Panicked any
	Tx       T
}

// CallAll makes one call per key at the same time — process(k, its
// result), which calls ProcessMessage and may set the result's Tx from its
// handler — and returns the results in the order of keys, a panic caught.
// The coalescing tests use it: calls made at once share a group.
func CallAll[T comparable](keys []string, process func(k string, c *Call[T]) (idempotent.Outcome, error)) []Call[T] {
	res := make([]Call[T], len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { res[i].Panicked = recover() }()
			res[i].Outcome, res[i].Err = process(k, &res[i])
		}()
	}
	wg.Wait()
	return res
}

// SameTx fails the test unless every result of idx recorded the same,
// non-zero, transaction.
func SameTx[T comparable](t testing.TB, res []Call[T], idx ...int) {
	t.Helper()
	var zero T
	for _, i := range idx[1:] {
		if res[i].Tx == zero || res[i].Tx != res[idx[0]].Tx {
			t.Fatalf("results %v did not share one transaction: %+v", idx, res)
		}
	}
}
