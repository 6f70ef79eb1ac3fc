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

// schemaSQL returns the statements EnsureSchema runs for the mode.
func (m *Middleware) schemaSQL() []string {
	if m.ret.part != nil {
		return m.ret.part.PartitionedSchemaSQL(m.table)
	}
	return m.d.SchemaSQL(m.table)
}

// afterSchema checks that the claim table has the mode's layout and, in
// partitioned mode, creates the missing partitions.
func (m *Middleware) afterSchema(ctx context.Context) error {
	p, ok := m.d.(dialect.Partitioner)
	if !ok {
		return nil
	}
	exists, partitioned, err := m.tableKind(ctx, p)
	if err != nil {
		return err
	}
	switch {
	case !exists:
		return fmt.Errorf("%w: %s", ErrNoClaimTable, m.table)
	case partitioned && m.ret.part == nil:
		return fmt.Errorf("idempotent: claim table %s is partitioned, but the Middleware was not given WithDailyPartitions", m.table)
	case !partitioned && m.ret.part != nil:
		return fmt.Errorf("idempotent: WithDailyPartitions: claim table %s exists and is not partitioned; migrate it (or drop it) first", m.table)
	case !partitioned:
		return nil
	}
	_, err = m.maintain(ctx, false)
	return err
}

func (m *Middleware) tableKind(ctx context.Context, p dialect.Partitioner) (exists, partitioned bool, err error) {
	q, args := p.TableKindSQL(m.table)
	if err := m.db.QueryRowContext(ctx, q, args...).Scan(&exists, &partitioned); err != nil {
		return false, false, fmt.Errorf("idempotent: inspect claim table %s: %w", m.table, err)
	}
	return exists, partitioned, nil
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
// changed, including when an error stopped it part way.
func (m *Middleware) MaintainPartitions(ctx context.Context) (PartitionReport, error) {
	if m.ret.part == nil {
		return PartitionReport{}, fmt.Errorf("idempotent: MaintainPartitions: the Middleware for %s is not in partitioned mode (WithDailyPartitions)", m.table)
	}
	if err := refuseNested(ctx); err != nil {
		return PartitionReport{}, fmt.Errorf("idempotent: MaintainPartitions: %w", err)
	}
	exists, partitioned, err := m.tableKind(ctx, m.ret.part)
	switch {
	case err != nil:
		return PartitionReport{}, err
	case !exists:
		return PartitionReport{}, fmt.Errorf("%w: %s (run EnsureSchema or the migration first)", ErrNoClaimTable, m.table)
	case !partitioned:
		return PartitionReport{}, fmt.Errorf("idempotent: MaintainPartitions: claim table %s is not partitioned", m.table)
	}
	return m.maintain(ctx, true)
}

// maintain creates the missing days and, when drop is set, drops the old
// ones. Every change is decided again under the maintenance lock, so that
// processes running it at once neither collide nor report the same change.
func (m *Middleware) maintain(ctx context.Context, drop bool) (PartitionReport, error) {
	var rep PartitionReport
	p := m.ret.part
	existing, err := m.Partitions(ctx)
	if err != nil {
		return rep, err
	}
	have := make(map[time.Time]bool, len(existing))
	for _, e := range existing {
		have[e.Day] = true
	}
	now := m.now()
	first := eventDay(m.keepAfter(now))
	last := eventDay(now).AddDate(0, 0, m.ret.leadDays)
	for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
		if have[d] {
			continue
		}
		name := p.PartitionName(m.table, d)
		done, err := m.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if _, ok := cur[name]; ok {
				return ""
			}
			return p.CreatePartitionSQL(m.table, d)
		})
		if err != nil {
			return rep, fmt.Errorf("idempotent: create partition %s of %s: %w", name, m.table, err)
		}
		if done {
			rep.Created = append(rep.Created, Partition{Name: name, Day: d, Attached: true})
		}
	}
	if !drop {
		return rep, nil
	}
	for _, e := range existing {
		if !e.Day.Before(first) {
			continue
		}
		// Detach (if still attached), then drop, each in its own
		// transaction, so the claim table is locked only for the detach.
		if _, err := m.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if c, ok := cur[e.Name]; ok && c.Attached {
				return p.DetachPartitionSQL(m.table, e.Name)
			}
			return ""
		}); err != nil {
			return rep, fmt.Errorf("idempotent: detach partition %s of %s: %w", e.Name, m.table, err)
		}
		done, err := m.maintenanceTx(ctx, func(cur map[string]Partition) string {
			if _, ok := cur[e.Name]; ok {
				return p.DropPartitionSQL(m.table, e.Name)
			}
			return ""
		})
		if err != nil {
			return rep, fmt.Errorf("idempotent: drop detached partition %s of %s: %w", e.Name, m.table, err)
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
func (m *Middleware) maintenanceTx(ctx context.Context, decide func(map[string]Partition) string) (bool, error) {
	p := m.ret.part
	r := runner{db: m.db, d: m.d, policy: m.run.policy}
	var ran bool
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		ran = false
		if _, err := tx.ExecContext(ctx, p.MaintenanceLockSQL(m.table)); err != nil {
			return err
		}
		list, err := m.listPartitions(ctx, tx)
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
		if s := m.d.LockTimeoutSQL(PartitionLockTimeout); s != "" {
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
	return ran, m.tableError(err)
}

// tableError turns an undefined-table failure into ErrNoClaimTable.
func (m *Middleware) tableError(err error) error {
	if err != nil && m.d.Classify(err).Kind == dialect.KindUndefinedTable {
		return fmt.Errorf("%w: %s: %w", ErrNoClaimTable, m.table, err)
	}
	return err
}

// Partitions lists the claim table's day partitions, oldest first, including
// any left detached by an interrupted drop. It fails with ErrNoClaimTable
// when the table does not exist, and when the dialect does not implement
// dialect.Partitioner.
func (m *Middleware) Partitions(ctx context.Context) ([]Partition, error) {
	p, ok := m.d.(dialect.Partitioner)
	if !ok {
		return nil, fmt.Errorf("idempotent: Partitions: the %s dialect does not support partitions", m.d.Name())
	}
	exists, _, err := m.tableKind(ctx, p)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, fmt.Errorf("%w: %s", ErrNoClaimTable, m.table)
	}
	ps, err := m.listPartitions(ctx, m.db)
	if err != nil {
		return nil, fmt.Errorf("idempotent: list partitions of %s: %w", m.table, err)
	}
	return ps, nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (m *Middleware) listPartitions(ctx context.Context, q querier) ([]Partition, error) {
	p := m.d.(dialect.Partitioner)
	query, args := p.ListPartitionsSQL(m.table)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Partition
	prefix := strings.TrimSuffix(p.PartitionName(m.table, time.Unix(0, 0)), "19700101")
	for rows.Next() {
		var e Partition
		if err := rows.Scan(&e.Name, &e.Attached); err != nil {
			return nil, err
		}
		day, err := time.Parse("20060102", strings.TrimPrefix(e.Name, prefix))
		if err != nil || !strings.HasPrefix(e.Name, prefix) || p.PartitionName(m.table, day) != e.Name {
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
