package idempotent

import "time"

// Read-only accessors for what a Middleware was configured with, for
// adapters and test helpers (the mocks package) that must send or expect
// what the Middleware sends without the caller repeating its options.
// Consumer, Table, Dialect, Retention and Partitioned are beside New and
// WithRetention.

// LockTimeout returns the claim's lock timeout set by WithLockTimeout, or 0
// when none was set.
func (m *Middleware) LockTimeout() time.Duration { return m.lockTimeout }

// StrictGuard reports whether the Middleware was created WithStrictGuard.
func (m *Middleware) StrictGuard() bool { return m.txidSQL != "" }

// ClockSkew returns the clock-skew margin set by WithClockSkew (default
// DefaultClockSkew).
func (m *Middleware) ClockSkew() time.Duration { return m.ret.skew }

// PartitionLeadDays returns the lead days given to WithDailyPartitions, or 0
// when the Middleware is not in partitioned mode.
func (m *Middleware) PartitionLeadDays() int { return m.ret.leadDays }

// Now returns the time by the Middleware's clock (WithClock; default
// time.Now), the clock the retention fence reads.
func (m *Middleware) Now() time.Time { return m.ret.clock() }
