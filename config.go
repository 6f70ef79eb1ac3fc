package idempotent

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// Config is what a Middleware was configured with: New's arguments and the
// options that change what it sends. Adapters and test helpers (package
// mocks) read it to send or expect exactly what the Middleware does without
// the caller repeating its options. It is a copy: changing it changes
// nothing in the Middleware.
type Config struct {
	// Consumer is the consumer name given to New.
	Consumer string
	// Dialect is the dialect given to New.
	Dialect dialect.Dialect
	// Table is the claim table's name as configured (WithTable), unquoted;
	// the same as ClaimTable().Name().
	Table string
	// Retention is the retention window (WithRetention; default
	// DefaultRetention).
	Retention time.Duration
	// ClockSkew is the clock-skew margin (WithClockSkew; default
	// DefaultClockSkew).
	ClockSkew time.Duration
	// Clock is the Middleware's clock (WithClock; default time.Now), the
	// one the retention fence reads.
	Clock func() time.Time
	// PartitionLeadDays is the lead days given to WithDailyPartitions, 0
	// when the table is not partitioned.
	PartitionLeadDays int
	// LockTimeout is the claim's lock timeout (WithLockTimeout), 0 when
	// none was set.
	LockTimeout time.Duration
	// StrictGuard reports whether the Middleware was created
	// WithStrictGuard.
	StrictGuard bool
	// Coalescing is WithCoalescing's bound, the zero value when
	// ProcessMessage calls do not share transactions.
	Coalescing Coalescing
	// Ordering reports whether the Middleware was created WithOrdering:
	// adapters then route the deliveries of one ordering key to one
	// worker.
	Ordering bool
}

// Partitioned reports whether the claim table is partitioned by event day
// (WithDailyPartitions), where every message needs its event time.
func (c Config) Partitioned() bool { return c.PartitionLeadDays > 0 }

// Config returns what the Middleware was configured with.
func (m *Middleware) Config() Config {
	c := Config{
		Consumer:          m.consumer,
		Dialect:           m.d,
		Table:             m.table.String(),
		Retention:         m.ret.window,
		ClockSkew:         m.ret.skew,
		Clock:             m.ret.clock,
		PartitionLeadDays: m.ret.leadDays,
		LockTimeout:       m.lockTimeout,
		StrictGuard:       m.txidSQL != "",
		Ordering:          m.ord != nil,
	}
	if m.co != nil {
		c.Coalescing = m.co.c
	}
	return c
}

// ClaimError is the one mapping of a failed claim statement's error into
// this package's error values, for the Middleware's own claims and for a
// driver package's (idempgx) that sends the same statements another way: a
// lock timeout is ErrClaimBusy, naming LockTimeout when one was set (else
// it was the database's own); a missing claim table is ErrNoClaimTable,
// naming it; in partitioned mode, a missing partition for a claim of
// messages with event times ats is ErrNoPartition, naming their days;
// anything else is wrapped as a claim failure. err stays in the chain, for
// errors.Is and errors.As.
func (c Config) ClaimError(err error, ats ...time.Time) error {
	if p, ok := c.Dialect.(dialect.Partitioner); ok && c.Partitioned() && len(ats) > 0 && p.IsNoPartition(err) {
		days := make([]string, len(ats))
		for i, at := range ats {
			days[i] = eventDay(at).Format(time.DateOnly)
		}
		slices.Sort(days)
		days = slices.Compact(days)
		which := "event day " + days[0]
		if len(days) > 1 {
			which = "one of the event days " + strings.Join(days, ", ")
		}
		return fmt.Errorf("%w: %s has no partition for %s yet (partitions cover the retention window and %d days ahead; run MaintainPartitions, then deliver again): %w",
			ErrNoPartition, c.Table, which, c.PartitionLeadDays, err)
	}
	switch c.Dialect.Classify(err).Kind {
	case dialect.KindLockTimeout:
		if c.LockTimeout == 0 {
			// The database's own lock timeout, not WithLockTimeout's.
			return fmt.Errorf("%w: %w", ErrClaimBusy, err)
		}
		return fmt.Errorf("%w (lock timeout %v): %w", ErrClaimBusy, c.LockTimeout, err)
	case dialect.KindUndefinedTable:
		return fmt.Errorf("%w: %s: %w", ErrNoClaimTable, c.Table, err)
	}
	return fmt.Errorf("idempotent: claim: %w", err)
}
