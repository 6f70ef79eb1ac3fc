package adapter

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"

	"github.com/txclaim/idempotent"
)

// OrderKeyHeader and OrderSeqHeader are the headers (message attributes,
// record headers) in which a producer sets a message's ordering key and
// sequence number (idempotent.Message.OrderKey and OrderSeq; see
// docs/ordering.md). They are the same names in every adapter and every
// sender of this module.
const (
	OrderKeyHeader = "Idempotent-Order-Key"
	OrderSeqHeader = "Idempotent-Order-Seq"
)

// FormatOrderSeq returns seq as the value of OrderSeqHeader: decimal.
func FormatOrderSeq(seq int64) string { return strconv.FormatInt(seq, 10) }

// ParseOrder parses the values of OrderKeyHeader and OrderSeqHeader. Both
// empty is no ordering, with no error. Otherwise both must be set and the
// sequence a decimal integer of at least 1: any other value is an error
// matching idempotent.ErrInvalidOrder that names the header and quotes the
// value. The delivery is poison (Rule.Settle): its re-sends carry the same
// values.
func ParseOrder(key, seq string) (string, int64, error) {
	seq = strings.TrimSpace(seq)
	switch {
	case key == "" && seq == "":
		return "", 0, nil
	case key == "":
		return "", 0, fmt.Errorf("%w: %s is %q but %s is missing", idempotent.ErrInvalidOrder, OrderSeqHeader, seq, OrderKeyHeader)
	case seq == "":
		return "", 0, fmt.Errorf("%w: %s is %q but %s is missing", idempotent.ErrInvalidOrder, OrderKeyHeader, key, OrderSeqHeader)
	}
	n, err := strconv.ParseInt(seq, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %s %q is not a decimal integer", idempotent.ErrInvalidOrder, OrderSeqHeader, seq)
	}
	if n < 1 {
		return "", 0, fmt.Errorf("%w: %s %q is below 1", idempotent.ErrInvalidOrder, OrderSeqHeader, seq)
	}
	return key, n, nil
}

// Shard returns the worker, from 0 to n-1, that handles deliveries of
// ordering key (or, for an unordered delivery, message key) key: a hash
// of the key, so that one entity's deliveries run one after another on one
// worker while other entities run on the others. In-process routing only
// avoids needless parking; across processes the database keeps the order.
func Shard(key string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// Route spreads the deliveries of in over n channels by Shard of key(d) —
// a delivery whose key is empty goes to the channels in turn — and closes
// them all once in is closed and drained. Each channel holds up to buffer
// deliveries; a worker that falls behind holds back, through Route, the
// deliveries routed after its own, as one consumer would.
func Route[T any](in <-chan T, n, buffer int, key func(T) string) []<-chan T {
	outs := make([]chan T, n)
	ro := make([]<-chan T, n)
	for i := range outs {
		outs[i] = make(chan T, buffer)
		ro[i] = outs[i]
	}
	go func() {
		turn := 0
		for d := range in {
			k := key(d)
			if k == "" {
				turn = (turn + 1) % n
				outs[turn] <- d
				continue
			}
			outs[Shard(k, n)] <- d
		}
		for _, o := range outs {
			close(o)
		}
	}()
	return ro
}

// RouteKey is the key a delivery is routed to a worker by (Route): its
// OrderKeyHeader, else its message key (the key function's; "" when that
// fails, and the delivery then goes to the workers in turn).
func (c *Config[T]) RouteKey(msg T) string {
	if c.tr.Header != nil {
		if k, ok := c.tr.Header(msg, OrderKeyHeader); ok && k != "" {
			return k
		}
	}
	if c.key == nil {
		return ""
	}
	k, err := c.key(msg)
	if err != nil {
		return ""
	}
	return k
}

// Routed reports whether the consumer's workers take deliveries by a hash
// of their ordering key (Route, RouteKey): when the Middleware keeps order
// (Ordering) and there is more than one worker. One entity's deliveries
// then run one after another, in the order the transport gave them, so
// that they need not park; other entities run on the other workers.
func (c *Config[T]) Routed() bool { return c.Ordering() && c.workers > 1 }

// Route spreads the deliveries of in over the workers by RouteKey (see
// the function Route), each channel holding one delivery.
func (c *Config[T]) Route(in <-chan T) []<-chan T {
	return Route(in, c.workers, 1, c.RouteKey)
}

// Serial runs the calls given one key one at a time and calls given
// different keys at once: the in-process routing by ordering key of an
// adapter that does not own its workers (a Watermill handler, whose
// router calls it concurrently), so that one entity's deliveries do not
// hold two transactions, one waiting on the other's lock of the entity's
// sequence row. Its zero value is ready to use.
type Serial struct {
	mu   sync.Mutex
	keys map[string]*serialKey
}

// serialKey is one key's turn (a lock that is a channel) and how many
// calls hold or wait for it.
type serialKey struct {
	turn chan struct{}
	n    int
}

// Do runs fn once no other call of Do with key is running; an empty key
// runs fn at once.
func (s *Serial) Do(key string, fn func()) {
	if key == "" {
		fn()
		return
	}
	s.mu.Lock()
	if s.keys == nil {
		s.keys = map[string]*serialKey{}
	}
	k := s.keys[key]
	if k == nil {
		k = &serialKey{turn: make(chan struct{}, 1)}
		s.keys[key] = k
	}
	k.n++
	s.mu.Unlock()
	k.turn <- struct{}{}
	defer func() {
		<-k.turn
		s.mu.Lock()
		if k.n--; k.n == 0 {
			delete(s.keys, key)
		}
		s.mu.Unlock()
	}()
	fn()
}
