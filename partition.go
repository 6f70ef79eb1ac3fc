package idempotent

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// PartitionLockTimeout bounds how long MaintainPartitions waits for the lock
// it needs on the claim table to attach or detach a day. While it waits, new
// claims queue behind it, so the wait is kept short: a longer one fails
// MaintainPartitions, which can simply run again later.
const PartitionLockTimeout = 5 * time.Second

// PartitionDrainTimeout bounds how long MaintainPartitions waits, after
// raising the table's retention horizon past the days it drops and before
// dropping them, for sessions still running on older snapshots (see
// ErrOldSnapshots).
const PartitionDrainTimeout = time.Minute

// Partition is one day's partition of a partitioned claim table.
type Partition struct {
	// Name is the partition's table name, unquoted, in the claim table's
	// schema.
	Name string
	// Day is the UTC midnight starting the day whose claims the partition
	// holds.
	Day time.Time
	// Attached is false for a partition detached by a drop that was
	// interrupted; MaintainPartitions drops it on its next run.
	Attached bool
}

// PartitionReport says what MaintainPartitions changed.
type PartitionReport struct {
	// Created are the partitions created, oldest first.
	Created []Partition
	// Dropped are the partitions detached and dropped, oldest first.
	Dropped []Partition
}

// MaintainPartitions keeps a partitioned claim table's days: it creates the
// partition of every day from the oldest day still inside the retention
// window (plus the clock-skew margin) to leadDays days after today, and
// detaches, then drops, every day that ended before that window. It never
// drops a day that could hold a claim the retention fence still relies on,
// and there is no default partition: a claim for a day with no partition
// fails with ErrNoPartition instead of landing somewhere it would not be
// found.
//
// Each partition is created, detached or dropped in its own short
// transaction, under a lock that serialises MaintainPartitions between
// processes, and with PartitionLockTimeout as its lock wait. Run it at least
// daily (from a scheduler, or the idempotent CLI's "partitions" command); it
// is safe to run often and from many processes. The report lists what
// changed, including when an error stopped it part way. The ClaimTable must
// be given WithDailyPartitions. Called with a handler's context, it fails
// with ErrAutocommit.
func (t *ClaimTable) MaintainPartitions(ctx context.Context) (PartitionReport, error) {
	if t.ret.part == nil {
		return PartitionReport{}, fmt.Errorf("idempotent: MaintainPartitions: the %s for %s is not in partitioned mode (WithDailyPartitions)", t.owner, t.table)
	}
	if err := refuseNested(ctx); err != nil {
		return PartitionReport{}, fmt.Errorf("idempotent: MaintainPartitions: %w", err)
	}
	exists, partitioned, err := t.tableKind(ctx, t.ret.part)
	switch {
	case err != nil:
		return PartitionReport{}, err
	case !exists:
		return PartitionReport{}, fmt.Errorf("%w: %s (run EnsureSchema or the migration first)", ErrNoClaimTable, t.table)
	case !partitioned:
		return PartitionReport{}, fmt.Errorf("%w: %s (MaintainPartitions; Cleanup deletes its old claims)", ErrNotPartitioned, t.table)
	}
	return t.maintain(ctx, true)
}

// maintain creates the missing days and, when drop is set, drops the old
// ones. Every change is decided again under the maintenance lock, so that
// processes running it at once neither collide nor report the same change.
func (t *ClaimTable) maintain(ctx context.Context, drop bool) (PartitionReport, error) {
	var rep PartitionReport
	p := t.ret.part
	existing, err := t.Partitions(ctx)
	if err != nil {
		return rep, err
	}
	have := make(map[time.Time]bool, len(existing))
	for _, e := range existing {
		have[e.Day] = true
	}
	now := t.now()
	first := eventDay(t.keepAfter(now))
	last := eventDay(now).AddDate(0, 0, t.ret.leadDays)
	// The window's first day, or the horizon if later: a day the table has
	// already dropped is never created again, whatever this process's
	// window says, or a replay into it would find no claim.
	create := first
	h, ok, err := horizonOf(ctx, t.db, t.hk, t.table, "")
	if err != nil {
		return rep, fmt.Errorf("idempotent: horizon of %s: %w", t.table, t.horizonTableError(err))
	}
	if ok && h.After(create) {
		create = eventDay(h.Add(24*time.Hour - time.Nanosecond)) // the first whole day at or after h
	}
	for d := create; !d.After(last); d = d.AddDate(0, 0, 1) {
		if have[d] {
			continue
		}
		name := p.PartitionName(t.table, d)
		done, err := t.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if _, ok := cur[name]; ok {
				return ""
			}
			return p.CreatePartitionSQL(t.table, d)
		})
		if err != nil {
			return rep, fmt.Errorf("idempotent: create partition %s of %s: %w", name, t.table, err)
		}
		if done {
			rep.Created = append(rep.Created, Partition{Name: name, Day: d, Attached: true})
		}
	}
	if !drop {
		return rep, nil
	}
	var old []Partition
	for _, e := range existing {
		if e.Day.Before(first) {
			old = append(old, e)
		}
	}
	if len(old) == 0 {
		return rep, nil
	}
	// The horizon first, past the last day dropped: from here on no claim
	// of those days is accepted, and once the old snapshots are gone none
	// can be running.
	if err := t.raiseHorizon(ctx, "", old[len(old)-1].Day.AddDate(0, 0, 1), PartitionDrainTimeout); err != nil {
		return rep, err
	}
	for _, e := range old {
		// Detach (if still attached), then drop, each in its own
		// transaction, so the claim table is locked only for the detach.
		// A dialect with no detach (DetachPartitionSQL "") drops at once.
		if _, err := t.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if c, ok := cur[e.Name]; ok && c.Attached {
				return p.DetachPartitionSQL(t.table, e.Name)
			}
			return ""
		}); err != nil {
			return rep, fmt.Errorf("idempotent: detach partition %s of %s: %w", e.Name, t.table, err)
		}
		done, err := t.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if _, ok := cur[e.Name]; ok {
				return p.DropPartitionSQL(t.table, e.Name)
			}
			return ""
		})
		if err != nil {
			return rep, fmt.Errorf("idempotent: drop detached partition %s of %s: %w", e.Name, t.table, err)
		}
		if done {
			rep.Dropped = append(rep.Dropped, e)
		}
	}
	return rep, nil
}

// maintenanceTx runs one transaction under the maintenance lock: decide sees
// the partitions as they are once the lock is held and returns the statement
// to run, or "" for none. It runs the statement under PartitionLockTimeout
// and reports whether it ran one.
func (t *ClaimTable) maintenanceTx(ctx context.Context, decide func(map[string]Partition) string) (bool, error) {
	p := t.ret.part
	r := runner{db: t.db, d: t.d, policy: t.policy}
	var ran bool
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) (err error) {
		ran = false
		if _, err := tx.ExecContext(ctx, p.MaintenanceLockSQL(t.table)); err != nil {
			return err
		}
		if lr, ok := t.d.(dialect.LockReleaser); ok {
			defer func() {
				if stmt, args := lr.ReleaseMaintenanceSQL(t.table); stmt != "" {
					if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), stmt, args...); rerr != nil && err == nil {
						err = fmt.Errorf("release the maintenance lock: %w", rerr)
					}
				}
			}()
		}
		list, err := t.listPartitions(ctx, tx)
		if err != nil {
			return err
		}
		cur := make(map[string]Partition, len(list))
		for _, e := range list {
			cur[e.Name] = e
		}
		stmt := decide(cur)
		if stmt == "" {
			return nil
		}
		if s := t.d.LockTimeoutSQL(PartitionLockTimeout); s != "" {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
		ran = true
		return nil
	})
	return ran, t.tableError(err)
}

// Partitions lists the claim table's day partitions, oldest first, including
// any left detached by an interrupted drop. It fails with ErrNoClaimTable
// when the table does not exist, and when the dialect does not implement
// dialect.Partitioner.
func (t *ClaimTable) Partitions(ctx context.Context) ([]Partition, error) {
	p, ok := t.d.(dialect.Partitioner)
	if !ok {
		return nil, fmt.Errorf("idempotent: Partitions: the %s dialect does not support partitions", t.d.Name())
	}
	exists, _, err := t.tableKind(ctx, p)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, fmt.Errorf("%w: %s", ErrNoClaimTable, t.table)
	}
	ps, err := t.listPartitions(ctx, t.db)
	if err != nil {
		return nil, fmt.Errorf("idempotent: list partitions of %s: %w", t.table, err)
	}
	return ps, nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (t *ClaimTable) listPartitions(ctx context.Context, q querier) ([]Partition, error) {
	p := t.d.(dialect.Partitioner)
	query, args := p.ListPartitionsSQL(t.table)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Partition
	prefix := strings.TrimSuffix(p.PartitionName(t.table, time.Unix(0, 0)), "19700101")
	for rows.Next() {
		var e Partition
		if err := rows.Scan(&e.Name, &e.Attached); err != nil {
			return nil, err
		}
		day, err := time.Parse("20060102", strings.TrimPrefix(e.Name, prefix))
		if err != nil || !strings.HasPrefix(e.Name, prefix) || p.PartitionName(t.table, day) != e.Name {
			continue // named like a partition, but not one of ours
		}
		e.Day = day
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
