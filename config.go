package idempotent

import (
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
}

// Partitioned reports whether the claim table is partitioned by event day
// (WithDailyPartitions), where every message needs its event time.
func (c Config) Partitioned() bool { return c.PartitionLeadDays > 0 }

// Config returns what the Middleware was configured with.
func (m *Middleware) Config() Config {
	return Config{
		Consumer:          m.consumer,
		Dialect:           m.d,
		Table:             m.table.String(),
		Retention:         m.ret.window,
		ClockSkew:         m.ret.skew,
		Clock:             m.ret.clock,
		PartitionLeadDays: m.ret.leadDays,
		LockTimeout:       m.lockTimeout,
		StrictGuard:       m.txidSQL != "",
	}
}
