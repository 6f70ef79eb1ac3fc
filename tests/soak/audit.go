package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// laneAudit is what the audit found in one lane.
type laneAudit struct {
	lane                                          string
	orders, ledgerRows, claims, customers, points int64
}

// auditLane checks the lane's effect against the producer's orders:
//
//   - per customer, the balance equals the sum of points over the
//     customer's distinct orders, exactly;
//   - every order has exactly one ledger row, with its customer and points
//     (none lost, none doubled), and no ledger row names an unknown order;
//   - every order has its claim, and there are no other claims.
func (s *soak) auditLane(ctx context.Context, db *sql.DB, l lane, res *result) laneAudit {
	a := laneAudit{lane: l.name}
	fail := func(format string, args ...any) { res.failf("audit %s: "+format, append([]any{l.name}, args...)...) }
	scalar := func(q string, dst *int64) bool {
		if err := db.QueryRowContext(ctx, q).Scan(dst); err != nil {
			fail("%v", err)
			return false
		}
		return true
	}
	scalar("SELECT count(*) FROM "+l.q("orders"), &a.orders)
	scalar("SELECT count(*) FROM "+l.q("point_ledger"), &a.ledgerRows)
	scalar("SELECT count(*) FROM "+l.q("processed_messages"), &a.claims)
	scalar("SELECT count(*) FROM "+l.q("balances"), &a.customers)
	scalar("SELECT coalesce(sum(points), 0) FROM "+l.q("balances"), &a.points)

	// Balances against the sum over distinct orders.
	rows, err := db.QueryContext(ctx, `SELECT b.customer_id, b.points, coalesce(o.points, 0)
FROM `+l.q("balances")+` b LEFT JOIN (SELECT customer_id, sum(points) AS points FROM `+l.q("orders")+` GROUP BY customer_id) o USING (customer_id)
WHERE b.points <> coalesce(o.points, 0) ORDER BY b.customer_id`)
	if err != nil {
		fail("%v", err)
	} else {
		for rows.Next() {
			var c, got, want int64
			if err := rows.Scan(&c, &got, &want); err != nil {
				fail("%v", err)
				break
			}
			fail("customer %d has %d points, the sum over their distinct orders is %d (%+d)", c, got, want, got-want)
		}
		if err := rows.Err(); err != nil {
			fail("%v", err)
		}
		_ = rows.Close()
	}
	var orphans int64
	if scalar(`SELECT count(*) FROM `+l.q("orders")+` WHERE customer_id NOT IN (SELECT customer_id FROM `+l.q("balances")+`)`, &orphans) && orphans > 0 {
		fail("%d orders of customers without a balance row", orphans)
	}

	// Exactly one ledger row per order.
	var lost, doubled, extra, wrong int64
	if scalar(`SELECT count(*) FROM `+l.q("orders")+` o WHERE NOT EXISTS (SELECT 1 FROM `+l.q("point_ledger")+` p WHERE p.order_id = o.order_id)`, &lost) && lost > 0 {
		fail("%d orders lost: no ledger row", lost)
	}
	if scalar(`SELECT count(*) FROM (SELECT order_id FROM `+l.q("point_ledger")+` GROUP BY order_id HAVING count(*) > 1) d`, &doubled) && doubled > 0 {
		fail("%d orders applied more than once: several ledger rows", doubled)
	}
	if scalar(`SELECT count(*) FROM `+l.q("point_ledger")+` p WHERE NOT EXISTS (SELECT 1 FROM `+l.q("orders")+` o WHERE o.order_id = p.order_id)`, &extra) && extra > 0 {
		fail("%d ledger rows for orders never published", extra)
	}
	if scalar(`SELECT count(*) FROM `+l.q("point_ledger")+` p JOIN `+l.q("orders")+` o USING (order_id) WHERE p.customer_id <> o.customer_id OR p.points <> o.points`, &wrong) && wrong > 0 {
		fail("%d ledger rows whose customer or points differ from the order", wrong)
	}

	// One claim per order, and nothing else.
	var unclaimed int64
	if scalar(`SELECT count(*) FROM `+l.q("orders")+` o WHERE NOT EXISTS (SELECT 1 FROM `+l.q("processed_messages")+` c
WHERE c.consumer = 'loyalty' AND c.message_key = 'order-completed:' || o.order_id)`, &unclaimed) && unclaimed > 0 {
		fail("%d orders have no claim", unclaimed)
	}
	if a.claims != a.orders {
		fail("%d claims for %d orders", a.claims, a.orders)
	}
	if a.orders == 0 {
		fail("no orders were published")
	}
	return a
}

// print writes the run's figures and the audit result.
func (s *soak) print(res *result, faulted, drained time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.out
	fmt.Fprintf(w, "soak: %v of production under faults, then %v to drain\n", faulted.Round(time.Millisecond), drained.Round(time.Millisecond))
	var processed, dups int64
	for _, l := range lanes {
		st := s.stats[l.name]
		var applied, dup, failed, retries, leaseErr, ackErr, redelivered int64
		reasons, fails := map[string]int64{}, map[string]int64{}
		for _, r := range s.reports {
			if r.Lane != l.name {
				continue
			}
			applied += r.Applied
			dup += r.Duplicates
			failed += r.Failed
			retries += r.Retries
			leaseErr += r.LeaseErrors
			ackErr += r.AckErrors
			redelivered += r.Redelivered
			for k, v := range r.RetryReasons {
				reasons[k] += v
			}
			for k, v := range r.FailReasons {
				fails[k] += v
			}
		}
		for _, k := range []string{"other", "autocommit", "invalid_key"} {
			if n := fails[k]; n > 0 {
				res.failf("lane %s: %d deliveries failed with errors the middleware should have retried or never produced (%s); see the consumers' standard error", l.name, n, k)
			}
		}
		processed += applied + dup + failed
		dups += dup
		fmt.Fprintf(w, "soak: lane %s: published %d orders in %d deliveries (%d concurrent duplicates, %d out-of-order replays, %.1f%% duplicates)\n",
			l.name, st.orders.Load(), st.deliveries.Load(), st.dupConcurrent.Load(), st.dupReplay.Load(),
			100*float64(st.dupConcurrent.Load()+st.dupReplay.Load())/float64(max(1, st.deliveries.Load())))
		fmt.Fprintf(w, "soak: lane %s: processed %d: applied %d, duplicates detected %d, failed and redelivered %d%s; retries %d%s; redelivered after a lease expired %d; lease errors %d, lost acks %d\n",
			l.name, applied+dup+failed, applied, dup, failed, counts(fails), retries, counts(reasons), redelivered, leaseErr, ackErr)
	}
	fmt.Fprintf(w, "soak: messages processed %d, duplicates detected %d (consumer reports; a SIGKILLed consumer's last %v is not counted)\n", processed, dups, reportEvery)
	var fl []string
	for _, k := range faultKinds {
		n, per := 0, []string{}
		for _, l := range lanes {
			if c := s.faults[k][l.name]; c > 0 {
				n += c
				per = append(per, fmt.Sprintf("%s %d", l.name, c))
			}
		}
		n += s.faults[k][""]
		desc := fmt.Sprintf("%s %d", k, n)
		if len(per) > 0 {
			desc += " (" + strings.Join(per, ", ") + ")"
		}
		if k == faultRestart && n > 0 {
			desc += fmt.Sprintf(" (down %v)", s.restart.Round(time.Millisecond))
		}
		if k == faultFailover && n > 0 {
			desc += fmt.Sprintf(" (killed and promoted in %v)", s.failover.Round(time.Millisecond))
		}
		if m := s.missed[k]; m > 0 {
			desc += fmt.Sprintf(" [%d found no target]", m)
		}
		fl = append(fl, desc)
		if globalFault(k) {
			if n == 0 {
				res.failf("fault %s was never injected", k)
			}
			continue
		}
		for _, l := range lanes {
			if s.faults[k][l.name] == 0 {
				res.failf("fault %s was never injected in lane %s", k, l.name)
			}
		}
	}
	fmt.Fprintf(w, "soak: faults injected: %s\n", strings.Join(fl, "; "))
	for _, a := range s.audits {
		fmt.Fprintf(w, "soak: audit %s: %d customers, %d distinct orders, %d ledger rows, %d claims, %d points in all\n",
			a.lane, a.customers, a.orders, a.ledgerRows, a.claims, a.points)
	}
	if res.ok() {
		fmt.Fprintf(w, "soak: audit PASS: every order applied exactly once, balances exact, no connection leaked (seed=%d)\n", s.cfg.Seed)
		return
	}
	for _, p := range res.problems {
		fmt.Fprintf(w, "soak: audit FAIL: %s\n", p)
	}
	if b, err := os.ReadFile(s.conslog.Name()); err == nil && len(b) > 0 {
		const n = 4000
		if len(b) > n {
			b = b[len(b)-n:]
		}
		fmt.Fprintf(w, "soak: end of the consumers' standard error:\n%s\n", b)
	}
}

// counts formats a map of counts as " (a 1, b 2)", or "" when empty.
func counts(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
