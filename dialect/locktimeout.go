package dialect

// LockTimeoutResetter is an optional interface of a [Dialect] whose
// LockTimeoutSQL sets a session setting that would otherwise outlive the
// transaction (MySQL's innodb_lock_wait_timeout has no transaction-scoped
// form). The middleware runs LockTimeoutResetSQL on the claim's transaction
// right after the claim statement, whether the claim succeeded or not, so
// the connection goes back to the pool with its own setting. The lock
// timeout then bounds the claim's wait only, not the handler's.
type LockTimeoutResetter interface {
	LockTimeoutResetSQL() string
}
