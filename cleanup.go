package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// ErrCleanupBusy reports that another Cleanup of the same claim table held
// the table's cleanup lock when this one tried to start a batch. The lock is
// held only for the length of one batch's transaction; the other runner goes
// on until nothing is left. Cleanup then returns at once with the number of
// claims it had deleted itself (0 if it had not started), and no claim is
// ever deleted twice. Treat it as "someone else is doing it", not a failure.
// On SQLite the cleanup lock is the database's write lock, which a batch
// waits for (the busy timeout, then the retry policy's attempts): a batch
// that could not have it in all that time, because other cleanups or other
// writers kept it, also ends the Cleanup with ErrCleanupBusy, never with
// the driver's SQLITE_BUSY; the next run deletes what is left.
var ErrCleanupBusy = errors.New("idempotent: another cleanup of the claim table is running")

// CleanupOptions tunes ClaimTable.Cleanup and ClaimTable.CleanupConsumer.
// Start from DefaultCleanupOptions: every numeric field must be set (zero is
// an error, not a default).
type CleanupOptions struct {
	// BatchSize is how many claims one batch deletes at most. Smaller
	// batches hold locks and write WAL in shorter bursts. Default 10,000.
	BatchSize int
	// MinBatchSize is the floor the batch size halves down to when batches
	// run out of StatementTimeout. When a batch of MinBatchSize times out,
	// Cleanup stops with the database's error. Default 100.
	MinBatchSize int
	// StatementTimeout bounds each batch's DELETE. A batch that runs out of
	// it deletes nothing (its transaction rolls back) and the next batch is
	// half the size. Default 5 seconds.
	StatementTimeout time.Duration
	// Pause is slept between batches, with no transaction open, to leave
	// the database room (replication, vacuum). Default 0.
	Pause time.Duration
	// DrainTimeout bounds how long a cleanup waits, after raising the
	// table's retention horizon and before deleting, for sessions still
	// running on snapshots older than the change (Postgres; see
	// ErrOldSnapshots). Default 1 minute.
	DrainTimeout time.Duration
	// DryRun counts the claims Cleanup would delete and deletes nothing; the
	// count is returned as deleted. Default false.
	DryRun bool
	// Progress, if set, is called after every batch, on Cleanup's
	// goroutine. Default nil.
	Progress func(CleanupProgress)
}

// DefaultCleanupOptions returns batches of 10,000, halving down to 100 when a
// batch runs longer than 5 seconds, with no pause.
func DefaultCleanupOptions() CleanupOptions {
	return CleanupOptions{BatchSize: 10_000, MinBatchSize: 100, StatementTimeout: 5 * time.Second, DrainTimeout: time.Minute}
}

// Validate reports the first field of o that Cleanup would reject.
func (o CleanupOptions) Validate() error {
	switch {
	case o.BatchSize < 1:
		return fmt.Errorf("BatchSize is %d, want at least 1 (start from DefaultCleanupOptions)", o.BatchSize)
	case o.MinBatchSize < 1:
		return fmt.Errorf("MinBatchSize is %d, want at least 1", o.MinBatchSize)
	case o.MinBatchSize > o.BatchSize:
		return fmt.Errorf("MinBatchSize %d is larger than BatchSize %d", o.MinBatchSize, o.BatchSize)
	case o.StatementTimeout <= 0:
		return fmt.Errorf("StatementTimeout is %v, want a positive duration", o.StatementTimeout)
	case o.Pause < 0:
		return fmt.Errorf("Pause is negative (%v)", o.Pause)
	case o.DrainTimeout <= 0:
		return fmt.Errorf("DrainTimeout is %v, want a positive duration", o.DrainTimeout)
	}
	return nil
}

// CleanupProgress describes one batch of a Cleanup.
type CleanupProgress struct {
	// Batch numbers the batches of this Cleanup from 1.
	Batch int
	// Deleted is how many claims this batch deleted.
	Deleted int64
	// Total is how many claims this Cleanup has deleted so far.
	Total int64
	// BatchSize is the limit this batch ran with.
	BatchSize int
	// Took is how long the batch's transaction took, commit included.
	Took time.Duration
	// TimedOut is set when the batch ran out of the statement timeout and
	// was rolled back; the next batch is half the size.
	TimedOut bool
	// Cutoff is the processed_at before which claims are deleted: now minus
	// the retention window and the clock-skew margin.
	Cutoff time.Time
}

// Cleanup deletes the claims of every consumer of the table processed before
// the retention window (plus the clock-skew margin), in batches, and returns
// how many it deleted. It never deletes a claim inside the window: the
// cutoff is fixed when Cleanup starts. Use it when every consumer of the
// table uses the same retention window; otherwise clean each consumer with
// CleanupConsumer and its own window.
//
// Each batch is its own short transaction: it takes the table's cleanup lock
// without waiting (a transaction-scoped lock, safe behind transaction-mode
// poolers), sets a statement timeout, and deletes at most BatchSize claims.
// Batches repeat until one deletes nothing. A batch that times out is rolled
// back and the batch size halves, down to MinBatchSize. If another cleanup
// of the table holds the lock, Cleanup returns at once with what it had
// deleted and an error matching ErrCleanupBusy. The context is checked
// between batches (and cancels a running one); on cancellation Cleanup
// returns what it deleted with the context's error. Serialization failures
// and lost connections are retried under the retry policy (WithRetry).
//
// A missing table is an error matching ErrNoClaimTable that names it. A
// partitioned table is refused: MaintainPartitions drops whole days instead.
// Bad options are an error before anything is sent. Called with a handler's
// context, it fails with ErrAutocommit.
func (t *ClaimTable) Cleanup(ctx context.Context, opts CleanupOptions) (deleted int64, err error) {
	return t.cleanup(ctx, "Cleanup", "", opts)
}

// CleanupConsumer is Cleanup for the claims of one consumer only, for a
// table shared by consumers with different retention windows: give the
// ClaimTable that consumer's window (WithRetention). It leaves every other
// consumer's claims alone. A bad consumer name is an error matching
// ErrInvalidConsumer before anything is sent.
func (t *ClaimTable) CleanupConsumer(ctx context.Context, consumer string, opts CleanupOptions) (deleted int64, err error) {
	if err := validateConsumer(consumer); err != nil {
		return 0, fmt.Errorf("idempotent: CleanupConsumer: %w", err)
	}
	return t.cleanup(ctx, "CleanupConsumer", consumer, opts)
}

// cleanup is Cleanup (consumer "") and CleanupConsumer; op names the method
// in errors.
func (t *ClaimTable) cleanup(ctx context.Context, op, consumer string, opts CleanupOptions) (deleted int64, err error) {
	if err := refuseNested(ctx); err != nil {
		return 0, fmt.Errorf("idempotent: %s: %w", op, err)
	}
	if err := opts.Validate(); err != nil {
		return 0, fmt.Errorf("idempotent: %s: %w", op, err)
	}
	c, ok := t.d.(dialect.Cleaner)
	if !ok {
		return 0, fmt.Errorf("idempotent: %s: the %s dialect does not support batched cleanup", op, t.d.Name())
	}
	if t.ret.part != nil {
		return 0, fmt.Errorf("idempotent: %s: claim table %s is partitioned by day; MaintainPartitions drops old days instead", op, t.table)
	}
	if p, ok := t.d.(dialect.Partitioner); ok {
		// A plain table configured on a partitioned one: ctids repeat
		// across partitions, so the batched delete does not apply.
		exists, partitioned, err := t.tableKind(ctx, p)
		switch {
		case err != nil:
			return 0, err
		case !exists:
			return 0, fmt.Errorf("idempotent: cleanup: %w: %s", ErrNoClaimTable, t.table)
		case partitioned:
			return 0, fmt.Errorf("idempotent: %s: claim table %s is partitioned; MaintainPartitions drops old days instead", op, t.table)
		}
	}
	cutoff := t.keepAfter(t.now())
	if opts.DryRun {
		return t.countExpired(ctx, c, cutoff, consumer)
	}
	// The horizon first: from here on no claim older than the cutoff is
	// accepted, and once the old snapshots are gone none can be running.
	if err := t.raiseHorizon(ctx, consumer, cutoff, opts.DrainTimeout); err != nil {
		if t.cleanupLockBusy(err) {
			return 0, fmt.Errorf("%w: %s: the lock stayed taken through every retry (nothing deleted): %w", ErrCleanupBusy, t.table, err)
		}
		return 0, err
	}
	size := opts.BatchSize
	r := runner{db: t.db, d: t.d, policy: t.policy}
	for batch := 1; ; batch++ {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("idempotent: cleanup of %s: %w", t.table, err)
		}
		var n int64
		start := time.Now()
		_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
			var err error
			n, err = t.cleanupBatch(ctx, tx, c, cutoff, size, consumer, opts)
			return err
		})
		p := CleanupProgress{Batch: batch, BatchSize: size, Took: time.Since(start), Cutoff: cutoff}
		switch {
		case err == nil:
		case errors.Is(err, ErrCleanupBusy):
			return deleted, fmt.Errorf("%w: %s (deleted %d before it took over)", ErrCleanupBusy, t.table, deleted)
		case ctx.Err() != nil:
			return deleted, fmt.Errorf("idempotent: cleanup of %s: %w", t.table, errors.Join(ctx.Err(), err))
		case t.cleanupLockBusy(err):
			return deleted, fmt.Errorf("%w: %s: the lock stayed taken through every retry (deleted %d before): %w", ErrCleanupBusy, t.table, deleted, err)
		case c.IsStatementTimeout(err) && size > opts.MinBatchSize:
			size = max(size/2, opts.MinBatchSize)
			p.TimedOut = true
		case c.IsStatementTimeout(err):
			return deleted, fmt.Errorf("idempotent: cleanup of %s: a batch of %d claims (the floor) ran longer than %v: %w", t.table, size, opts.StatementTimeout, err)
		default:
			return deleted, fmt.Errorf("idempotent: cleanup of %s: %w", t.table, t.tableError(err))
		}
		deleted += n
		p.Deleted, p.Total = n, deleted
		if opts.Progress != nil {
			opts.Progress(p)
		}
		if n == 0 && !p.TimedOut {
			return deleted, nil
		}
		if err := sleep(ctx, opts.Pause); err != nil {
			return deleted, fmt.Errorf("idempotent: cleanup of %s: %w", t.table, err)
		}
	}
}

// cleanupLockBusy reports an error that means the dialect's cleanup lock,
// one a batch waits for (dialect.CleanupLockWaiter), stayed taken.
func (t *ClaimTable) cleanupLockBusy(err error) bool {
	w, ok := t.d.(dialect.CleanupLockWaiter)
	return ok && w.IsCleanupLockBusy(err)
}

// cleanupBatch runs one batch in tx: the lock, the timeout, the horizon
// (already raised: this only records it again in the transaction that
// deletes), the delete of consumer's claims (every consumer's when consumer
// is "") and, where the dialect's lock outlives transactions, its release.
func (t *ClaimTable) cleanupBatch(ctx context.Context, tx *sql.Tx, c dialect.Cleaner, cutoff time.Time, size int, consumer string, opts CleanupOptions) (n int64, err error) {
	var got bool
	lock, largs := c.CleanupLockSQL(t.table)
	if err := tx.QueryRowContext(ctx, lock, largs...).Scan(&got); err != nil {
		return 0, err
	}
	if !got {
		return 0, ErrCleanupBusy
	}
	if lr, ok := t.d.(dialect.LockReleaser); ok {
		defer func() {
			if stmt, args := lr.ReleaseCleanupSQL(t.table); stmt != "" {
				if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), stmt, args...); rerr != nil && err == nil {
					n, err = 0, fmt.Errorf("release the cleanup lock: %w", rerr)
				}
			}
		}()
	}
	if s := c.StatementTimeoutSQL(opts.StatementTimeout); s != "" {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return 0, err
		}
	}
	adv, aargs := c.AdvanceHorizonSQL(t.table, consumer, cutoff)
	if _, err := tx.ExecContext(ctx, adv, aargs...); err != nil {
		return 0, err
	}
	del, args := c.CleanupBatchSQL(t.table, consumer, cutoff, size)
	res, err := tx.ExecContext(ctx, del, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// countExpired counts what a cleanup would delete: consumer's claims, or
// every consumer's when consumer is "".
func (t *ClaimTable) countExpired(ctx context.Context, c dialect.Cleaner, cutoff time.Time, consumer string) (int64, error) {
	q, args := c.CountExpiredSQL(t.table, consumer, cutoff)
	var n int64
	if err := t.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("idempotent: cleanup of %s (dry run): %w", t.table, t.tableError(err))
	}
	return n, nil
}
