package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// NaturalFunc applies an effect whose own unique key is the idempotency
// record, and reports whether it took effect. The usual shape is the guide's
// Step 4: an INSERT … ON CONFLICT DO NOTHING on the business table, whose
// rows affected (or RETURNING) say whether the message was new.
type NaturalFunc func(ctx context.Context, tx *sql.Tx) (applied bool, err error)

// ProcessNatural runs fn in a transaction with the middleware's isolation
// level, retries, guard and observer, but without the claim table: fn's own
// conflict-free insert on a natural key (one ledger row per order, say) is
// what makes a redelivery harmless. It returns Applied when fn reports that
// its effect took place and Duplicate when not; the transaction commits
// either way. msg.Key identifies the message to the observer and in errors,
// and is validated like ProcessMessage's. msg.EventTime is not read: with
// no claim there is nothing a retention window could forget, so no fence,
// and no partition to choose, in partitioned mode too. WithStrictGuard
// applies here as well: the transaction id is read before fn runs and
// checked before COMMIT.
//
// Natural keys on business tables never expire, so they cover replays of any
// age: prefer them for money. For state that a message replaces rather than
// adds to, dialect.NewVersionedUpsert builds the version-guarded upsert
// whose rows affected fn can return.
func (m *Middleware) ProcessNatural(ctx context.Context, msg Message, fn NaturalFunc) (Outcome, error) {
	key := msg.Key
	if fn == nil {
		return 0, errors.New("idempotent: ProcessNatural: nil function")
	}
	return m.observe(ctx, key, func(ctx context.Context) (Outcome, int, error) {
		if err := validateKey(key, m.maxKey); err != nil {
			return 0, 0, err
		}
		var outcome Outcome
		attempts, err := m.run.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
			if err := m.captureTxID(ctx, tx, st); err != nil {
				return err
			}
			st.inHandler = true
			applied, err := fn(ctx, tx)
			outcome = Duplicate
			if applied {
				outcome = Applied
			}
			return err
		})
		if err != nil {
			return 0, attempts, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
		}
		return outcome, attempts, nil
	})
}
