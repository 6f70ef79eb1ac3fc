package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/horizonlease"
	"github.com/txclaim/idempotent/postgres"
)

// The retention horizon, as the core's database/sql path fences it.
//
// The single claim of a message with an event time is
// postgres.Dialect.HorizonClaimQuerySQL: the statement reads the consumer's
// horizon, inserts only when the message's fence (below) is not before it,
// and returns the insert's count and the horizon it read. A claim it did not
// insert with a fence before the horizon is idempotent.ErrBeyondRetention;
// one it did not insert otherwise is a duplicate. It replaces the plain
// claim in the same Bind/Execute/Sync, so the fence adds no round trip. A
// message without an event time, which no horizon refuses (the core passes
// it a NULL fence), keeps the plain claim: the same answer for less of the
// server's time. The batch claim has no horizon in it: the
// horizon is read by HorizonSQL, a statement of its own queued after the
// batch claim in the same pipeline, so it runs after the insert, in the
// claim's transaction, and a new claim older than it fails the batch with an
// *idempotent.BatchKeyError. A day without its partition is
// ErrBeyondRetention when the horizon says it was dropped, else
// ErrNoPartition; the horizon is then read after the rollback, on the
// attempt's own connection (the claim's transaction is aborted, and a pool
// of one connection has no other).

// fence returns the value the horizon is compared with for a message with
// event time at, as the core's: none for no event time (never refused), the
// event day's UTC midnight in partitioned mode, the event time less the
// clock-skew margin on a plain table.
func (m *Middleware) fence(at time.Time) (time.Time, bool) {
	switch {
	case at.IsZero():
		return time.Time{}, false
	case m.partitioned:
		y, mo, d := at.UTC().Date()
		return time.Date(y, mo, d, 0, 0, 0, 0, time.UTC), true
	}
	return at.Add(-m.skew).UTC(), true
}

// beyond reports whether a message with event time at is older than the
// horizon h, microseconds since the Unix epoch; nil is no horizon.
func (m *Middleware) beyond(at time.Time, h *int64) bool {
	f, ok := m.fence(at)
	return ok && h != nil && time.UnixMicro(*h).After(f)
}

// beyondHorizon is the error of a message older than the table's horizon
// h (microseconds since the Unix epoch), worded as the core's.
func (m *Middleware) beyondHorizon(key string, at time.Time, h int64) error {
	ht := time.UnixMicro(h).UTC()
	what := "claims processed before " + ht.Format(time.RFC3339) + " may have been cleaned up"
	if m.partitioned {
		what = "the days before " + ht.Format(time.DateOnly) + " were dropped"
	}
	who := fmt.Sprintf("consumer %q", m.consumer)
	if key != "" {
		who += fmt.Sprintf(", key %q", key)
	}
	return fmt.Errorf("%w: %s: event time %s is older than the retention horizon of %s (%s), so its claim may be gone",
		idempotent.ErrBeyondRetention, who, at.UTC().Format(time.RFC3339), m.table, what)
}

// horizonClaimed is the outcome of the single claim statement: it inserted
// n claims (0 or 1) and read the horizon h (nil for none).
func (m *Middleware) horizonClaimed(key string, at time.Time, n int64, h *int64) (bool, error) {
	if n == 1 {
		return true, nil
	}
	if m.beyond(at, h) {
		return false, m.beyondHorizon(key, at, *h)
	}
	return false, nil
}

// missingDay is a claim that found no partition for its event day: an
// ErrNoPartition until the attempt, after its rollback, reads the horizon
// and finds the day dropped (resolveMissingDay).
type missingDay struct {
	err   error       // the ErrNoPartition error
	cause error       // the database's error
	ats   []time.Time // the claim's event times
	keys  []string    // in a batch, the key of ats[j]; nil for one message
	index []int       // in a batch, the index of ats[j]'s first message
}

func (e *missingDay) Error() string { return e.err.Error() }
func (e *missingDay) Unwrap() error { return e.err }

// resolveMissingDay turns a missingDay of err whose day is before the
// horizon into ErrBeyondRetention (in a batch, an *idempotent.BatchKeyError
// naming the first message of that day). It reads the horizon on l, the
// attempt's connection after its rollback; when that cannot be done, err
// stays ErrNoPartition, as the core's does when its read fails.
func (m *Middleware) resolveMissingDay(ctx context.Context, l *lease, err error) error {
	var md *missingDay
	if !errors.As(err, &md) {
		return err
	}
	if st, closed := m.status(l); closed || st != 'I' {
		return err
	}
	var h *int64
	if herr := l.c.QueryRow(ctx, m.horizonSQL, m.horizonArgs...).Scan(&h); herr != nil {
		return err
	}
	for j, at := range md.ats {
		if !m.beyond(at, h) {
			continue
		}
		if md.index == nil {
			return fmt.Errorf("%w: %w", m.beyondHorizon("", at, *h), md.cause)
		}
		return &idempotent.BatchKeyError{Index: md.index[j], Err: fmt.Errorf("%w: %w", m.beyondHorizon(md.keys[j], at, *h), md.cause)}
	}
	return err
}

// The horizon under a lease (WithHorizonLease), as the core's: see
// idempotent.WithHorizonLease and docs/operations.md. The single claim of
// a message with an event time is fenced in memory against the horizon
// cached on the pool, and sent as the plain claim (claimSQL), while the
// cache is fresh; the claim then relies on it only if it returned while
// the cache was still fresh, else the horizon is read in the claim's
// transaction after the insert (recheck). A coalesced group's claims and
// the batch claim read the horizon as without a lease, and so does every
// claim on a partitioned table.

// WithHorizonLease lets the Middleware cache the claim table's retention
// horizon for up to d, as idempotent.WithHorizonLease does for the
// database/sql Middleware, instead of reading it in every claim of a
// message with an event time: ProcessMessage's claim is then the plain
// claim, and the fence costs the server nothing per message. It declares
// d in the table's horizon table, and every cleanup or partition drop of
// the table then waits d after raising the horizon before deleting. d must
// be from 1ms to 10 minutes. A partitioned table, a coalesced group and a
// batch read the horizon in their claims as without it. Default is none.
func WithHorizonLease(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if err := horizonlease.Check(d); err != nil {
			return fmt.Errorf("idempgx: WithHorizonLease: %v: %w", d, err)
		}
		c.lease = d
		return nil
	})
}

// initLease sets up the cache of WithHorizonLease on db, the pool's
// database/sql face: the cache's statements are rare, and run outside any
// claim's transaction.
func (m *Middleware) initLease(db *sql.DB, pg *postgres.Dialect, table dialect.Table, d time.Duration) {
	declare, dargs := pg.AdvanceHorizonSQL(table, horizonlease.Row, horizonlease.Encode(d))
	m.lease = &horizonlease.Cache{
		Lease: d,
		Declare: func(ctx context.Context) error {
			if _, err := db.ExecContext(ctx, declare, dargs...); err != nil {
				return fmt.Errorf("idempgx: declare the horizon lease of %s: %w", m.table, err)
			}
			return nil
		},
		Read: func(ctx context.Context) (int64, bool, error) {
			var h sql.NullInt64
			if err := db.QueryRowContext(ctx, m.horizonSQL, m.horizonArgs...).Scan(&h); err != nil || !h.Valid {
				return 0, false, err
			}
			return h.Int64, true, nil
		},
	}
}

// useLease fences c's message against the cached horizon when a claim may
// rely on it: a message older than it is refused, else c claims with the
// plain claim.
func (c *claimOne) useLease() error {
	m := c.m
	if m.lease == nil || c.at.IsZero() || c.token != "" {
		return nil
	}
	snap, ok := m.lease.Peek()
	if !ok {
		return nil
	}
	if snap.OK && m.beyond(c.at, &snap.Micros) {
		return m.beyondHorizon(c.key, c.at, snap.Micros)
	}
	c.cached, c.snap = true, snap
	return nil
}

// rechecker is a claimer whose new claim may need the horizon read in its
// transaction before the handler runs.
type rechecker interface {
	recheck(ctx context.Context, l *lease) error
}

// recheck reads the horizon in the claim's transaction, on l, when c's
// claim relied on a cached horizon that was no longer fresh when the
// claim returned, and refuses the message if it is older than it.
func (c *claimOne) recheck(ctx context.Context, l *lease) error {
	m := c.m
	if !c.cached || m.lease.Fresh(c.snap) {
		return nil
	}
	var h *int64
	if err := l.c.QueryRow(ctx, m.horizonSQL, m.horizonArgs...).Scan(&h); err != nil {
		return fmt.Errorf("idempgx: read the retention horizon: %w", err)
	}
	if m.beyond(c.at, h) {
		return m.beyondHorizon(c.key, c.at, *h)
	}
	return nil
}
