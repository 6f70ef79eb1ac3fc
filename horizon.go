package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/horizonlease"
)

// The retention horizon.
//
// A retention window configured in a process is not a fact the guarantee
// can rest on: the process that cleans up and the process that claims may
// be configured differently, and a window lengthened on a deploy would let a
// replay through whose claim an earlier, shorter cleanup already deleted.
// So the claim table records it: before Cleanup deletes a claim, and before
// MaintainPartitions drops a day, each raises the table's horizon — how far
// back the table has forgotten — in the database, and every claim with an
// event time is refused with ErrBeyondRetention when the event is older
// than the horizon. The fence is therefore the later of the window (clock −
// window) and the horizon; a longer window takes effect forward only.
//
// The horizon is one row per consumer (CleanupConsumer) and one for the
// whole table (Cleanup, MaintainPartitions) in a table beside the claim
// table (dialect.HorizonKeeper: processed_messages_horizon for the default
// table), created by EnsureSchema and the migrations. For a plain table it
// is the processed_at cutoff of the latest cleanup: a claim processed
// before it may be gone, so an event older than it plus the clock-skew
// margin is refused (a claim's processed_at is never more than the margin
// before its event time: later event times are ErrInvalidEventTime). For a
// partitioned table it is the first day not dropped: an event of an earlier
// day is refused.
//
// The horizon is read in the claim's transaction, never from memory, so a
// process that has run for weeks sees a cleanup that ran a second ago. Where
// the dialect can (dialect.HorizonClaimer, Postgres), the claim statement
// reads it itself: no round trip is added. That read comes from the
// statement's snapshot, taken before its insert; so a cleanup, after raising
// the horizon, waits until no session still runs on a snapshot older than
// the change (dialect.SnapshotDrainer) before it deletes anything. Other
// dialects read the horizon with a statement after the insert, in the same
// transaction, which sees every cleanup that committed before the insert
// could succeed. docs/operations.md gives the whole argument.

// horizonMicros converts a horizon read from the database.
func horizonMicros(v sql.NullInt64) (time.Time, bool) {
	if !v.Valid {
		return time.Time{}, false
	}
	return time.UnixMicro(v.Int64).UTC(), true
}

// fence returns the value the horizon is compared with for a message with
// event time at: nil for no event time (never refused), the event's day in
// partitioned mode, and the event time less the clock-skew margin on a plain
// table.
func (r *retention) fence(at time.Time) any {
	if at.IsZero() {
		return nil
	}
	if r.part != nil {
		return eventDay(at)
	}
	return at.Add(-r.skew).UTC()
}

// beyond reports whether a message with event time at is older than the
// horizon h.
func (r *retention) beyond(at, h time.Time) bool {
	f, ok := r.fence(at).(time.Time)
	return ok && h.After(f)
}

// beyondHorizon is the error of a message older than the table's horizon.
func (m *Middleware) beyondHorizon(key string, at, h time.Time) error {
	what := "claims processed before " + h.Format(time.RFC3339) + " may have been cleaned up"
	if m.ret.part != nil {
		what = "the days before " + h.Format(time.DateOnly) + " were dropped"
	}
	who := fmt.Sprintf("consumer %q", m.consumer)
	if key != "" {
		who += fmt.Sprintf(", key %q", key)
	}
	return fmt.Errorf("%w: %s: event time %s is older than the retention horizon of %s (%s), so its claim may be gone",
		ErrBeyondRetention, who, at.UTC().Format(time.RFC3339), m.table, what)
}

// horizonOf reads the horizon of consumer ("" for the table's own row) on
// q, a transaction or the pool.
func horizonOf(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, hk dialect.HorizonKeeper, t dialect.Table, consumer string) (time.Time, bool, error) {
	query, args := hk.HorizonSQL(t, consumer)
	var v sql.NullInt64
	if err := q.QueryRowContext(ctx, query, args...).Scan(&v); err != nil {
		return time.Time{}, false, err
	}
	h, ok := horizonMicros(v)
	return h, ok, nil
}

// checkHorizonAfterClaim is the fence of a dialect that cannot read the
// horizon in its claim statement: read after the insert, in the claim's
// transaction. It returns nil when no message of ats (event times, zero for
// none) is older than the horizon, else the error of the first that is and
// its index.
func (m *Middleware) checkHorizonAfterClaim(ctx context.Context, tx *sql.Tx, keys []string, ats []time.Time) (int, error) {
	h, ok, err := horizonOf(ctx, tx, m.hk, m.table, m.consumer)
	if err != nil {
		return -1, m.claimError(err)
	}
	if !ok {
		return -1, nil
	}
	for i, at := range ats {
		if m.ret.beyond(at, h) {
			return i, m.beyondHorizon(keys[i], at, h)
		}
	}
	return -1, nil
}

// ErrOldSnapshots reports that a cleanup or partition drop raised the
// claim table's retention horizon but did not delete anything below it,
// because other sessions of the database still ran on snapshots older than
// the change after CleanupOptions.DrainTimeout: a claim statement on such a
// snapshot may have read the old horizon. Nothing was deleted; the horizon
// stays raised. Run it again later. The Postgres dialect waits for it
// (dialect.SnapshotDrainer); a long transaction anywhere in the database
// (a report, a pg_dump) holds it up.
var ErrOldSnapshots = errors.New("idempotent: sessions on snapshots older than the raised retention horizon are still running")

// raiseHorizon raises consumer's horizon ("" for the table's row) to
// before, in a transaction of its own, and then, where the dialect is a
// dialect.SnapshotDrainer, waits up to drain for the sessions whose
// snapshots are older than the change; before that it waits for the
// longest horizon lease declared on the table (waitLeases).
func (t *ClaimTable) raiseHorizon(ctx context.Context, consumer string, before time.Time, drain time.Duration) error {
	r := runner{db: t.db, d: t.d, policy: t.policy}
	stmt, args := t.hk.AdvanceHorizonSQL(t.table, consumer, before)
	if _, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		_, err := tx.ExecContext(ctx, stmt, args...)
		return err
	}); err != nil {
		return fmt.Errorf("idempotent: raise the retention horizon of %s: %w", t.table, t.tableError(err))
	}
	if err := t.waitLeases(ctx); err != nil {
		return err
	}
	sd, ok := t.d.(dialect.SnapshotDrainer)
	if !ok {
		return nil
	}
	q, qargs := sd.OlderSnapshotsSQL(t.table, consumer)
	deadline := time.Now().Add(drain)
	wait := 5 * time.Millisecond
	for {
		var n int64
		if err := t.db.QueryRowContext(ctx, q, qargs...).Scan(&n); err != nil {
			return fmt.Errorf("idempotent: wait for snapshots older than the retention horizon of %s: %w", t.table, t.tableError(err))
		}
		if n == 0 {
			return nil
		}
		if !time.Now().Add(wait).Before(deadline) {
			return fmt.Errorf("%w: %s: %d sessions after %v (horizon raised to %s, nothing deleted)", ErrOldSnapshots, t.table, n, drain, before.UTC().Format(time.RFC3339))
		}
		if err := sleep(ctx, wait); err != nil {
			return fmt.Errorf("idempotent: wait for snapshots older than the retention horizon of %s: %w", t.table, err)
		}
		wait = min(2*wait, time.Second)
	}
}

// Horizon is one row of a claim table's retention horizon.
type Horizon struct {
	// Consumer is the consumer the row is for; "" is the row of the whole
	// table, raised by Cleanup and MaintainPartitions.
	Consumer string
	// ForgottenBefore is how far back the table has forgotten: on a plain
	// table, claims processed before it may have been deleted; on a
	// partitioned table, the days before it (a UTC midnight) were dropped.
	ForgottenBefore time.Time
}

// Horizons lists the rows of the table's retention horizon, ordered by
// consumer; none before the first cleanup or partition drop. A missing
// horizon table is an error matching ErrNoClaimTable.
func (t *ClaimTable) Horizons(ctx context.Context) ([]Horizon, error) {
	if t.hk == nil {
		return nil, fmt.Errorf("idempotent: Horizons: the %s dialect does not record a retention horizon", t.d.Name())
	}
	rows, err := t.db.QueryContext(ctx, t.hk.HorizonsSQL(t.table))
	if err != nil {
		return nil, fmt.Errorf("idempotent: horizon of %s: %w", t.table, t.horizonTableError(err))
	}
	defer rows.Close()
	var out []Horizon
	for rows.Next() {
		var h Horizon
		var v sql.NullInt64
		if err := rows.Scan(&h.Consumer, &v); err != nil {
			return nil, fmt.Errorf("idempotent: horizon of %s: %w", t.table, err)
		}
		if h.Consumer == horizonlease.Row {
			continue // the leases processes declared, not a horizon
		}
		h.ForgottenBefore, _ = horizonMicros(v)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotent: horizon of %s: %w", t.table, err)
	}
	return out, nil
}

// horizonTableError turns an undefined-table failure into ErrNoClaimTable
// naming the horizon table.
func (t *ClaimTable) horizonTableError(err error) error {
	if err != nil && t.d.Classify(err).Kind == dialect.KindUndefinedTable {
		return fmt.Errorf("%w: %s or its horizon table %s (run EnsureSchema or the migration): %w", ErrNoClaimTable, t.table, t.hk.HorizonTable(t.table), err)
	}
	return err
}

// The horizon under a lease (WithHorizonLease).
//
// Reading the horizon in every claim costs the server a read of the
// horizon table per message. A Middleware made WithHorizonLease(d) instead
// declares d in the horizon table (horizonlease.Row, raised only), caches
// the horizon it reads on the pool, before the claim's transaction, at most
// every d/4, and fences a message against the cached value in memory,
// claiming with the plain claim statement. A claim relies on the cache only
// while less than d/2 has passed since the cache's read began, checked
// after the claim statement returned; past it (a process paused, a slow
// statement) the horizon is read in the claim's transaction after the
// insert, as a dialect without dialect.HorizonClaimer does, and a claim that
// is not sent in time uses the fenced claim. Cleanup and MaintainPartitions,
// after raising the horizon, wait the longest lease ever declared on the
// table before they delete or drop anything (waitLeases). A cached horizon
// that misses a raise was read before the raise committed, so every claim
// relying on it had returned before the raise plus d/2, before anything
// the raise allows is deleted: such a claim meets the old claim and is a
// duplicate. docs/operations.md gives the argument in full.

// WithHorizonLease lets the Middleware cache the claim table's retention
// horizon for up to d instead of reading it in every claim of a message
// with an event time: the fence then costs the server nothing per message.
// It declares d in the table's horizon table the first time it reads the
// horizon, and from then on every Cleanup, CleanupConsumer and
// MaintainPartitions of the table waits d (the longest lease any process
// ever declared there) after raising the horizon before deleting anything;
// run cleanups of a version that honours leases (this one) before
// processes that take them. d must be from 1ms to 10 minutes. It applies to
// ProcessMessage (and the Wrap functions), coalesced or not; batches read
// the horizon once per batch as before. Default is none: every claim reads
// the horizon.
func WithHorizonLease(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if err := horizonlease.Check(d); err != nil {
			return fmt.Errorf("idempotent: WithHorizonLease: %v: %w", d, err)
		}
		c.retention.lease = d
		return nil
	})
}

// initLease sets up the cache of WithHorizonLease, where the dialect keeps
// a horizon (without one, nothing fences by it and nothing is cached).
func (m *Middleware) initLease(d time.Duration) {
	if d <= 0 || m.hk == nil {
		return
	}
	m.lease = &horizonlease.Cache{
		Lease: d,
		Declare: func(ctx context.Context) error {
			stmt, args := m.hk.AdvanceHorizonSQL(m.table, horizonlease.Row, horizonlease.Encode(d))
			if _, err := m.db.ExecContext(ctx, stmt, args...); err != nil {
				return fmt.Errorf("idempotent: declare the horizon lease of %s: %w", m.table, err)
			}
			return nil
		},
		Read: func(ctx context.Context) (int64, bool, error) {
			h, ok, err := horizonOf(ctx, m.db, m.hk, m.table, m.consumer)
			if err != nil || !ok {
				return 0, false, err
			}
			return h.UnixMicro(), true, nil
		},
	}
}

// refreshLease refreshes the cached horizon of WithHorizonLease before a
// message with event time at is claimed, outside its transaction. A failed
// refresh is not the message's failure: its claim then reads the horizon
// itself, and meets the same trouble there if it lasts.
func (m *Middleware) refreshLease(ctx context.Context, at time.Time) {
	if m.lease == nil || at.IsZero() {
		return
	}
	_ = m.lease.Refresh(ctx)
}

// leasedHorizon is the fence of a message with event time at against the
// cached horizon: cached reports that the claim may rely on the cache (and
// so claims with the plain statement); err refuses a message older than it.
func (m *Middleware) leasedHorizon(key string, at time.Time) (snap horizonlease.Snapshot, cached bool, err error) {
	if m.lease == nil || at.IsZero() {
		return snap, false, nil
	}
	if snap, cached = m.lease.Peek(); !cached {
		return snap, false, nil
	}
	if snap.OK {
		if h := time.UnixMicro(snap.Micros).UTC(); m.ret.beyond(at, h) {
			return snap, true, m.beyondHorizon(key, at, h)
		}
	}
	return snap, true, nil
}

// waitLeases waits, after a raise of the horizon committed, for the
// longest lease declared on the table (WithHorizonLease), so that no claim
// relying on a horizon cached before the raise is still running when the
// caller deletes.
func (t *ClaimTable) waitLeases(ctx context.Context) error {
	rows, err := t.db.QueryContext(ctx, t.hk.HorizonsSQL(t.table))
	if err != nil {
		return fmt.Errorf("idempotent: read the horizon leases of %s: %w", t.table, t.horizonTableError(err))
	}
	var lease time.Duration
	for rows.Next() {
		var c string
		var v sql.NullInt64
		if err := rows.Scan(&c, &v); err != nil {
			_ = rows.Close()
			return fmt.Errorf("idempotent: read the horizon leases of %s: %w", t.table, err)
		}
		if c == horizonlease.Row && v.Valid {
			lease = horizonlease.Decode(v.Int64)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idempotent: read the horizon leases of %s: %w", t.table, err)
	}
	if err := horizonlease.Wait(ctx, lease); err != nil {
		return fmt.Errorf("idempotent: wait %v for the horizon leases of %s (horizon raised, nothing deleted): %w", lease, t.table, err)
	}
	return nil
}
