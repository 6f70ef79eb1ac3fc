package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/lib/pq"
)

// A lane is one isolation level under test: its own schema with the
// loyalty tables, its own inbox, and its own consumer processes. The lanes
// run side by side under the same faults.
type lane struct {
	name      string // schema name and label: "read_committed", "serializable"
	isolation sql.IsolationLevel
}

var lanes = []lane{
	{name: "read_committed", isolation: sql.LevelReadCommitted},
	{name: "serializable", isolation: sql.LevelSerializable},
}

func laneByName(name string) (lane, error) {
	for _, l := range lanes {
		if l.name == name {
			return l, nil
		}
	}
	return lane{}, fmt.Errorf("unknown lane %q", name)
}

// q quotes a table of the lane's schema.
func (l lane) q(table string) string {
	return pq.QuoteIdentifier(l.name) + "." + pq.QuoteIdentifier(table)
}

// claimTable is the claim table's name for idempotent.WithTable.
func (l lane) claimTable() string { return l.name + ".processed_messages" }

// setup creates the lane's schema:
//
//   - orders: the producer's record of every distinct order, the audit's
//     ground truth;
//   - inbox: the message source — at-least-once deliveries leased with
//     SKIP LOCKED and acknowledged by deleting;
//   - balances and point_ledger: the consumer's effect, as in the guide. The
//     ledger deliberately has no unique constraint on order_id, so that a
//     doubled effect shows in the audit instead of being stopped by it;
//   - a deferred constraint trigger that sleeps at COMMIT for ledger rows
//     with commit_delay_ms > 0, making the commit window wide enough for the
//     fault injector to kill a backend inside it.
//
// The claim table is created by the consumers with EnsureSchema.
func (l lane) setup(ctx context.Context, db *sql.DB, customers int) error {
	s := pq.QuoteIdentifier(l.name)
	stmt := fmt.Sprintf(`
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.orders (
	order_id    bigint PRIMARY KEY,
	customer_id bigint NOT NULL,
	points      bigint NOT NULL
);
CREATE TABLE %[1]s.inbox (
	id               bigserial PRIMARY KEY,
	order_id         bigint NOT NULL,
	customer_id      bigint NOT NULL,
	points           bigint NOT NULL,
	handler_delay_ms int NOT NULL DEFAULT 0,
	commit_delay_ms  int NOT NULL DEFAULT 0,
	available_at     timestamptz NOT NULL DEFAULT now(),
	lease_until      timestamptz,
	deliveries       int NOT NULL DEFAULT 0
);
CREATE INDEX ON %[1]s.inbox (available_at);
CREATE TABLE %[1]s.balances (
	customer_id bigint PRIMARY KEY,
	points      bigint NOT NULL DEFAULT 0
);
INSERT INTO %[1]s.balances SELECT g, 0 FROM generate_series(1, %[2]d) g;
CREATE TABLE %[1]s.point_ledger (
	id              bigserial PRIMARY KEY,
	customer_id     bigint NOT NULL,
	order_id        bigint NOT NULL,
	points          bigint NOT NULL,
	commit_delay_ms int NOT NULL DEFAULT 0
);
CREATE FUNCTION %[1]s.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(NEW.commit_delay_ms / 1000.0);
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON %[1]s.point_ledger
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	WHEN (NEW.commit_delay_ms > 0) EXECUTE FUNCTION %[1]s.slow_commit();`, s, customers)
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("set up lane %s: %w", l.name, err)
	}
	return nil
}
