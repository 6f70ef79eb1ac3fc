package adapter

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

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

// Route spreads the deliveries of in over n channels by Shard of key(d),
// and closes them all once in is closed and drained. Each channel holds up
// to buffer deliveries; a worker that falls behind holds back, through
// Route, the deliveries routed after its own, as one consumer would.
func Route[T any](in <-chan T, n, buffer int, key func(T) string) []<-chan T {
	outs := make([]chan T, n)
	ro := make([]<-chan T, n)
	for i := range outs {
		outs[i] = make(chan T, buffer)
		ro[i] = outs[i]
	}
	go func() {
		for d := range in {
			outs[Shard(key(d), n)] <- d
		}
		for _, o := range outs {
			close(o)
		}
	}()
	return ro
}
