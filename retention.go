package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// The retention window.
//
// A claim only deduplicates while it exists. Redeliveries after a crash or a
// network blip arrive within minutes; a dead-letter queue is triaged and
// replayed within days, at most a couple of weeks. Claims therefore live for
// a retention window — 30 days by default — and only then may Cleanup or
// MaintainPartitions remove them. A message redelivered after its claim is
// gone would be applied again, so a message that carries its own event time
// (Message.EventTime) is refused with ErrBeyondRetention once it is older
// than the window: the retention fence. A message without an event time (a
// zero Message.EventTime) cannot be fenced. For effects that no window makes
// safe, such as money, keep a natural unique key on the business table as
// well: it never expires.
//
// Clocks disagree: a producer's clock may run ahead of the consumer's, and
// the database stamps processed_at with its own. Claims are therefore kept
// for the window plus a clock-skew margin (5 minutes by default), while the
// fence refuses messages as soon as they are older than the window itself.
// As long as no two clocks differ by more than the margin, every message
// the fence lets through still finds its claim if it has one.
//
// The fence has an upper bound too: an event time later than the clock plus
// the margin is refused with ErrInvalidEventTime. A message dated days ahead
// (or in the year 58884, seconds read as milliseconds) would otherwise pass
// the fence for as long after its claim was cleaned up, and apply again.

// DefaultRetention is the retention window when WithRetention is not given:
// 30 days, which covers redeliveries (minutes), dead-letter triage and replay
// (days to a couple of weeks) with room to spare.
const DefaultRetention = 30 * 24 * time.Hour

// DefaultClockSkew is the clock-skew margin when WithClockSkew is not given.
const DefaultClockSkew = 5 * time.Minute

var (
	// ErrBeyondRetention reports a message that is too old: its event time
	// is older than the retention window, or than the retention horizon the
	// claim table records (what a cleanup or partition drop has forgotten,
	// whatever the window of the process that ran it), so its claim may
	// already have been deleted and applying it could double its effect. Nothing was written
	// and the handler did not run. The message is poison: it should go to a
	// dead-letter queue for a person to decide.
	ErrBeyondRetention = errors.New("idempotent: message outside the retention window")

	// ErrInvalidEventTime reports a message's event time that cannot be
	// right: later than the middleware's clock plus the clock-skew margin (a
	// producer clock far ahead, or seconds read as milliseconds), or zero
	// where one is required (partitioned mode). A message dated in the
	// future would pass the retention fence long after its claim was
	// cleaned up, so it is refused. Nothing was written and the handler did
	// not run. The message is poison.
	ErrInvalidEventTime = errors.New("idempotent: invalid event time")

	// ErrNoPartition reports, in partitioned mode, a message whose event
	// day — inside the retention window and after the table's retention
	// horizon, so neither too old nor in the future — has no partition yet: MaintainPartitions has not run since
	// the day came within reach. Nothing was written and the handler did
	// not run. It is transient: deliver the message again later (broker
	// adapters requeue it), and it applies once MaintainPartitions has
	// created the day. It matches neither ErrBeyondRetention (too old) nor
	// ErrClaimBusy.
	ErrNoPartition = errors.New("idempotent: no partition for the event day yet")
)

type retentionConfig struct {
	window   time.Duration
	skew     time.Duration
	clock    func() time.Time
	leadDays int           // > 0 in partitioned mode
	lease    time.Duration // WithHorizonLease; 0 reads the horizon in every claim
}

func defaultRetentionConfig() retentionConfig {
	return retentionConfig{window: DefaultRetention, skew: DefaultClockSkew, clock: time.Now}
}

// retention is a Middleware's retention settings.
type retention struct {
	retentionConfig
	// part is the dialect's partitioner in partitioned mode, nil otherwise.
	part dialect.Partitioner
}

// WithRetention sets the retention window: how long a claim must live, and
// so how late a redelivery or replay may arrive and still be recognised.
// Cleanup and MaintainPartitions remove only claims older than the window
// plus the clock-skew margin; a message whose event time is older than the
// window is refused with ErrBeyondRetention. Choose it longer than the longest
// dead-letter triage and replay you allow. d must be positive. Default is
// DefaultRetention (30 days).
func WithRetention(d time.Duration) TableOption {
	return tableOptionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idempotent: WithRetention: %v is not a positive duration", d)
		}
		c.retention.window = d
		return nil
	})
}

// WithClockSkew sets the clock-skew margin: claims are kept this much longer
// than the retention window, so that a producer clock running ahead of the
// consumer's (or a database clock differing from it) by up to d cannot let
// the fence pass a message whose claim is gone. d must not be negative.
// Default is DefaultClockSkew (5 minutes).
func WithClockSkew(d time.Duration) TableOption {
	return tableOptionFunc(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("idempotent: WithClockSkew: %v is negative", d)
		}
		c.retention.skew = d
		return nil
	})
}

// WithClock sets the clock the middleware reads for the retention fence,
// the cleanup cutoff and partition maintenance. Tests use it to move time;
// processed_at is still stamped by the database. Default is time.Now.
func WithClock(now func() time.Time) TableOption {
	return tableOptionFunc(func(c *config) error {
		if now == nil {
			return errors.New("idempotent: WithClock: nil clock")
		}
		c.retention.clock = now
		return nil
	})
}

// WithDailyPartitions selects partitioned mode: the claim table is
// partitioned by the UTC day of each message's event time, with the primary
// key (consumer, message_key, event day), and old claims leave by dropping
// whole days (MaintainPartitions) instead of deleting rows.
//
// The day comes from the producer-assigned event time, never from the time
// of processing: a redelivery or replay carries the same event time, lands
// in the same partition and meets its claim. (A table partitioned on
// processed_at would put a redelivery on another day into another partition,
// where the primary key cannot see the first claim, and apply it again.) So
// in this mode every message needs its event time — set Message.EventTime
// (ProcessMessage, ProcessMessages, ProcessMessageTx, ProcessMessagesTx,
// ClaimMessage, the Wrap functions) — and the producer must keep it stable across republishes,
// like the key itself.
//
// MaintainPartitions (and EnsureSchema) create the partitions for every day
// of the retention window and leadDays days ahead; run MaintainPartitions at
// least daily. leadDays must be at least 1. All consumers sharing a
// partitioned table share its retention, since a dropped day holds the claims
// of all of them. The dialect must implement dialect.Partitioner. Default is
// a plain, unpartitioned table.
func WithDailyPartitions(leadDays int) TableOption {
	return tableOptionFunc(func(c *config) error {
		if leadDays < 1 {
			return fmt.Errorf("idempotent: WithDailyPartitions: %d lead days, want at least 1", leadDays)
		}
		c.retention.leadDays = leadDays
		return nil
	})
}

// initRetention checks the retention settings against the dialect and, in
// partitioned mode, switches the claim statement to the event-day one.
func (m *Middleware) initRetention(c retentionConfig) error {
	m.ret = retention{retentionConfig: c}
	defer func() {
		m.hk, _ = m.d.(dialect.HorizonKeeper)
		if hc, ok := m.d.(dialect.HorizonClaimer); ok && m.hk != nil {
			m.hclaimSQL = hc.HorizonClaimSQL(m.table, m.ret.part != nil)
		}
		m.initLease(c.lease)
	}()
	if err := checkHorizonName(m.d, m.table); err != nil {
		return err
	}
	if c.leadDays == 0 {
		return nil
	}
	p, ok := m.d.(dialect.Partitioner)
	if !ok {
		return fmt.Errorf("idempotent: WithDailyPartitions: the %s dialect does not support partitions", m.d.Name())
	}
	if n := len(p.PartitionName(m.table, time.Unix(0, 0))); n > dialect.MaxIdentifierBytes {
		return fmt.Errorf("idempotent: WithDailyPartitions: table name %q is too long: its partitions' names would be %d bytes, the limit is %d",
			m.table.Name, n, dialect.MaxIdentifierBytes)
	}
	m.ret.part = p
	m.claimSQL = p.ClaimAtSQL(m.table)
	return nil
}

// checkHorizonName refuses a table whose horizon table's name would be
// longer than an identifier may be.
func checkHorizonName(d dialect.Dialect, t dialect.Table) error {
	hk, ok := d.(dialect.HorizonKeeper)
	if !ok {
		return nil
	}
	if n := len(hk.HorizonTable(t).Name); n > dialect.MaxIdentifierBytes {
		return fmt.Errorf("idempotent: table name %q is too long: its horizon table's name would be %d bytes, the limit is %d", t.Name, n, dialect.MaxIdentifierBytes)
	}
	return nil
}

func (m *Middleware) now() time.Time { return m.ret.clock() }

// checkEvent decides, before any transaction, whether a message with event
// time at (zero when it has none) may be claimed.
func (m *Middleware) checkEvent(key string, at time.Time) error {
	if at.IsZero() {
		if m.ret.part != nil {
			return fmt.Errorf("%w: consumer %q, key %q: the claim table %s is partitioned by event day: give the message its event time (Message.EventTime)",
				ErrInvalidEventTime, m.consumer, key, m.table)
		}
		return nil
	}
	now := m.now()
	if cutoff := now.Add(-m.ret.window); at.Before(cutoff) {
		return fmt.Errorf("%w: consumer %q, key %q: event time %s is %v old, older than the retention window of %v, so its claim may be gone",
			ErrBeyondRetention, m.consumer, key, at.UTC().Format(time.RFC3339), now.Sub(at).Round(time.Second), m.ret.window)
	}
	if limit := now.Add(m.ret.skew); at.After(limit) {
		return fmt.Errorf("%w: consumer %q, key %q: event time %s is in the future: the clock says %s, and the clock-skew margin is %v (a producer clock ahead, or seconds read as milliseconds?)",
			ErrInvalidEventTime, m.consumer, key, at.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), m.ret.skew)
	}
	return nil
}

// eventDay returns the UTC midnight starting t's day.
func eventDay(t time.Time) time.Time {
	y, mo, d := t.UTC().Date()
	return time.Date(y, mo, d, 0, 0, 0, 0, time.UTC)
}

// retentionClaimError translates a claim failure on tx that only retention
// settings explain; it returns nil for any other error. A day with no
// partition is ErrBeyondRetention when the horizon says it was dropped, else
// ErrNoPartition. The horizon is read in tx where a failed statement leaves
// the transaction usable (MySQL); where it aborts it (Postgres) the error is
// a *noPartitionError, which the entry points that own the transaction
// classify again once it is rolled back (reclassify) — never from the pool
// while tx holds a connection, which a pool of one would wait for forever.
func (m *Middleware) retentionClaimError(ctx context.Context, tx *sql.Tx, err error, idx []int, at ...time.Time) error {
	if m.ret.part == nil || !m.ret.part.IsNoPartition(err) {
		return nil
	}
	if m.hk != nil && tx != nil {
		if h, ok, herr := horizonOf(ctx, tx, m.hk, m.table, m.consumer); herr == nil {
			if i := m.firstBeyond(h, ok, at); i >= 0 {
				berr := fmt.Errorf("%w: %w", m.beyondHorizon("", at[i], h), err)
				if idx != nil {
					return &BatchKeyError{Index: idx[i], Err: berr}
				}
				return berr
			}
			return m.noPartition(err, false, nil, at)
		}
	}
	return m.noPartition(err, m.hk != nil, idx, at)
}

// firstBeyond returns the index of the first of ats older than the horizon
// h (ok false: none recorded), or -1.
func (m *Middleware) firstBeyond(h time.Time, ok bool, ats []time.Time) int {
	if !ok {
		return -1
	}
	for i, at := range ats {
		if m.ret.beyond(at, h) {
			return i
		}
	}
	return -1
}

// noPartitionError is ErrNoPartition not yet checked against the horizon:
// days are the event times the statement claimed, idx their messages'
// indexes in a batch (nil for one message).
type noPartitionError struct {
	err   error // ErrNoPartition, wrapping cause
	cause error // the database's error
	idx   []int
	days  []time.Time
}

func (e *noPartitionError) Error() string { return e.err.Error() }
func (e *noPartitionError) Unwrap() error { return e.err }

// noPartition is the ErrNoPartition of a claim of days; unchecked marks it
// for reclassify.
func (m *Middleware) noPartition(err error, unchecked bool, idx []int, at []time.Time) error {
	// checkEvent let at through, so its day is inside the window: the
	// partition is not there yet (or was removed by hand).
	nerr := m.Config().ClaimError(err, at...)
	if !unchecked {
		return nerr
	}
	return &noPartitionError{err: nerr, cause: err, idx: idx, days: at}
}

// reclassify is run by the entry points that own the claim's transaction,
// after it ended: an ErrNoPartition not yet checked against the horizon
// (its transaction was aborted) is checked now, from the pool, and becomes
// ErrBeyondRetention when its day was dropped. Other errors are returned as
// they are.
func (m *Middleware) reclassify(ctx context.Context, err error) error {
	var np *noPartitionError
	if err == nil || !errors.As(err, &np) {
		return err
	}
	h, ok, herr := horizonOf(ctx, m.db, m.hk, m.table, m.consumer)
	if herr != nil {
		return err
	}
	i := m.firstBeyond(h, ok, np.days)
	if i < 0 {
		return err
	}
	berr := fmt.Errorf("%w: %w", m.beyondHorizon("", np.days[i], h), np.cause)
	if np.idx != nil {
		return &BatchKeyError{Index: np.idx[i], Err: berr}
	}
	return berr
}
