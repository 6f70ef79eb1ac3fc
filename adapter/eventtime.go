package adapter

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
)

// EventTimeHeader is the header (message attribute, record header) in which
// a producer sets a message's event time, as FormatEventTime writes it. It
// is the same name in every adapter and every sender of this module.
const EventTimeHeader = "Idempotent-Event-Time"

// FormatEventTime returns t as the value of EventTimeHeader: RFC 3339 in
// UTC with nanoseconds, such as "2026-12-01T09:30:00.123456789Z".
func FormatEventTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ErrBadEventTime reports an EventTimeHeader whose value is not an RFC 3339
// time. It matches idempotent.ErrInvalidEventTime too; the delivery is
// poison (Rule.Settle), since its re-sends carry the same value.
var ErrBadEventTime = fmt.Errorf("%w: the %s header is not an RFC 3339 time", idempotent.ErrInvalidEventTime, EventTimeHeader)

// ParseEventTime parses the value of EventTimeHeader. An empty value is the
// zero time, with no error: the message has no event time. Any other value
// that is not RFC 3339 is an error matching ErrBadEventTime (and
// idempotent.ErrInvalidEventTime) that quotes it.
func ParseEventTime(v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q: %w", ErrBadEventTime, v, err)
	}
	return t, nil
}

// ErrNoProducerEventTime is returned by CheckEventTimeSource for a
// Middleware in partitioned mode whose adapter was given no source of a
// producer's event time.
var ErrNoProducerEventTime = errors.New("adapter: the claim table is partitioned by event day, but the adapter has no producer event time")

// CheckEventTimeSource is the check every adapter runs at construction:
// a Middleware in partitioned mode (idempotent.WithDailyPartitions) needs
// every message's event time, so an adapter that reads none (producer
// false: no header, no function) is refused before any delivery, rather
// than terminating every message later. adapterName names the adapter in
// the error.
func CheckEventTimeSource(mw *idempotent.Middleware, adapterName string, producer bool) error {
	if mw == nil || producer {
		return nil
	}
	return checkEventTimeSource(mw.Config(), adapterName)
}

// checkEventTimeSource is CheckEventTimeSource for a source that is not
// the producer's, given the Middleware's configuration.
func checkEventTimeSource(cfg idempotent.Config, adapterName string) error {
	if cfg.Partitioned() {
		return fmt.Errorf("%s: %w (claim table %s): read it from the %s header (the default) or a function over the payload",
			adapterName, ErrNoProducerEventTime, cfg.Table, EventTimeHeader)
	}
	return nil
}
