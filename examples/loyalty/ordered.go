package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"

	"github.com/txclaim/idempotent"
)

// -ordered: the story of ordered per key (docs/ordering.md). A ledger
// service applies each account's events — a deposit, then debits and
// credits — whose producer made sure that, applied in sequence order, no
// balance ever goes below zero. Deliveries come at least once and in any
// order: every event shuffled among all the others, 30% of them delivered
// twice. The naive consumer checks the event id, then applies; the
// library's runs the same effect through a Middleware created
// WithOrdering, which parks an event that came before its predecessor and
// applies it when the predecessor does. The audit counts, per run, the
// effects applied twice, out of sequence order and that left a balance
// below zero.

// ledgerEvent is one event of an account's ledger.
type ledgerEvent struct {
	Account int   `json:"account"`
	Seq     int64 `json:"seq"`
	Amount  int64 `json:"amount"` // positive: a credit; negative: a debit
}

func (e ledgerEvent) key() string      { return fmt.Sprintf("ledger:%d/%d", e.Account, e.Seq) }
func (e ledgerEvent) orderKey() string { return fmt.Sprintf("account:%d", e.Account) }

// orderedEventsPerAccount is each account's number of events.
const orderedEventsPerAccount = 20

// makeLedgerEvents returns the producer's events of accounts accounts, in
// sequence order: a deposit, then debits and credits that never overdraw
// the account in that order.
func makeLedgerEvents(accounts int, seed uint64) []ledgerEvent {
	rng := rand.New(rand.NewPCG(seed, 0x0dd))
	var evs []ledgerEvent
	for a := 1; a <= accounts; a++ {
		balance := int64(100)
		evs = append(evs, ledgerEvent{Account: a, Seq: 1, Amount: balance})
		for s := int64(2); s <= orderedEventsPerAccount; s++ {
			amount := int64(rng.IntN(90) + 10)
			if rng.IntN(3) > 0 && amount <= balance { // mostly debits, never an overdraft
				amount = -amount
			}
			balance += amount
			evs = append(evs, ledgerEvent{Account: a, Seq: s, Amount: amount})
		}
	}
	return evs
}

// orderedAudit is one run's audit.
type orderedAudit struct {
	name                           string
	events, applied, twice         int64
	outOfOrder, overdrafts, parked int64
	leftParked                     int
}

// ledgerTables creates a run's accounts (every balance 0) and ledger.
func (s *store) ledgerTables(ctx context.Context, run string, accounts int) (balances, ledger string, err error) {
	balances, ledger = s.prefix+run+"_accounts", s.prefix+run+"_ledger"
	s.tables = append(s.tables, balances, ledger)
	for _, st := range []string{
		"CREATE TABLE " + balances + " (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
		// pos is the row's place among the account's effects, balance the
		// balance the effect left.
		"CREATE TABLE " + ledger + " (event_key VARCHAR(64) NOT NULL, account BIGINT NOT NULL, seq BIGINT NOT NULL, pos BIGINT NOT NULL, balance BIGINT NOT NULL)",
	} {
		if _, err := s.db.ExecContext(ctx, st); err != nil {
			return "", "", fmt.Errorf("create tables: %w", err)
		}
	}
	for a := 1; a <= accounts; a++ {
		if _, err := s.db.ExecContext(ctx, s.q("INSERT INTO "+balances+" (account, balance) VALUES (?, 0)"), a); err != nil {
			return "", "", fmt.Errorf("create accounts: %w", err)
		}
	}
	return balances, ledger, nil
}

// applyLedgerEvent is the effect, through tx: the balance moves (the
// UPDATE locks the account's row, so the account's effects are written one
// after another), and the ledger records the event, its place and the
// balance it left.
func (s *store) applyLedgerEvent(ctx context.Context, tx *sql.Tx, balances, ledger string, e ledgerEvent) error {
	if _, err := tx.ExecContext(ctx, s.q("UPDATE "+balances+" SET balance = balance + ? WHERE account = ?"), e.Amount, e.Account); err != nil {
		return err
	}
	var balance int64
	if err := tx.QueryRowContext(ctx, s.q("SELECT balance FROM "+balances+" WHERE account = ?"), e.Account).Scan(&balance); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q("INSERT INTO "+ledger+" (event_key, account, seq, pos, balance) SELECT ?, ?, ?, COUNT(*) + 1, ? FROM "+ledger+" WHERE account = ?"),
		e.key(), e.Account, e.Seq, balance, e.Account)
	return err
}

// auditLedger reads a run's ledger: effects applied, twice, out of
// sequence order (below a sequence the account applied before), and
// leaving a balance below zero.
func (s *store) auditLedger(ctx context.Context, ledger string, a *orderedAudit) error {
	rows, err := s.db.QueryContext(ctx, "SELECT event_key, account, seq, balance FROM "+ledger+" ORDER BY account, pos")
	if err != nil {
		return err
	}
	defer rows.Close()
	seen := map[string]bool{}
	maxSeq := map[int64]int64{}
	for rows.Next() {
		var key string
		var account, seq, balance int64
		if err := rows.Scan(&key, &account, &seq, &balance); err != nil {
			return err
		}
		a.applied++
		if seen[key] {
			a.twice++
		}
		seen[key] = true
		if seq < maxSeq[account] {
			a.outOfOrder++
		}
		maxSeq[account] = max(maxSeq[account], seq)
		if balance < 0 {
			a.overdrafts++
		}
	}
	return rows.Err()
}

// orderedDeliveries returns the deliveries of evs: each event once, 30% a
// second time, all shuffled.
func orderedDeliveries(evs []ledgerEvent, seed uint64) []ledgerEvent {
	rng := rand.New(rand.NewPCG(seed, 0x5e9))
	out := append([]ledgerEvent(nil), evs...)
	for _, e := range evs {
		if rng.IntN(10) < 3 {
			out = append(out, e)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// deliverAll hands the deliveries to workers goroutines, each consume call
// one delivery, and returns the first error.
func deliverAll(ctx context.Context, deliveries []ledgerEvent, workers int, consume func(context.Context, ledgerEvent) error) error {
	ch := make(chan ledgerEvent)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range ch {
				if err := consume(ctx, e); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for _, e := range deliveries {
		select {
		case ch <- e:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(ch)
	go func() {
		for range ch { // drain what a failed worker left
		}
	}()
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// orderedDemo runs -ordered: the naive run and the library's, then the
// audit.
func orderedDemo(ctx context.Context, o options, st *store, out io.Writer) ([]orderedAudit, error) {
	accounts := max(o.orders/orderedEventsPerAccount, 5)
	evs := makeLedgerEvents(accounts, o.seed)
	deliveries := orderedDeliveries(evs, o.seed)
	workers := o.consumers * o.workers
	fmt.Fprintf(out, "loyalty -ordered: %d accounts x %d ledger events (a deposit, then debits and credits that never overdraw in order), %d workers\n",
		accounts, orderedEventsPerAccount, workers)
	fmt.Fprintf(out, "  database  %s\n  delivery  at least once, in any order: %d deliveries of %d events (30%% twice), shuffled\n\n", st.desc, len(deliveries), len(evs))

	// The naive consumer: the event id checked, then the effect.
	naive := orderedAudit{name: "naive check-then-act", events: int64(len(evs))}
	balances, ledger, err := st.ledgerTables(ctx, "naive", accounts)
	if err != nil {
		return nil, err
	}
	err = deliverAll(ctx, deliveries, workers, func(ctx context.Context, e ledgerEvent) error {
		var n int
		if err := st.db.QueryRowContext(ctx, st.q("SELECT COUNT(*) FROM "+ledger+" WHERE event_key = ?"), e.key()).Scan(&n); err != nil || n > 0 {
			return err
		}
		tx, err := st.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := st.applyLedgerEvent(ctx, tx, balances, ledger, e); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, fmt.Errorf("naive run: %w", err)
	}
	if err := st.auditLedger(ctx, ledger, &naive); err != nil {
		return nil, err
	}

	// The library's: the same effect, WithOrdering.
	lib := orderedAudit{name: "idempotent WithOrdering", events: int64(len(evs))}
	balances, ledger, err = st.ledgerTables(ctx, "ordered", accounts)
	if err != nil {
		return nil, err
	}
	claims := st.prefix + "ordered_claims"
	st.tables = append(st.tables, st.kind.horizon(claims), claims, claims+"_order_seq", claims+"_order_parked")
	apply := func(ctx context.Context, tx *sql.Tx, body []byte) error {
		var e ledgerEvent
		if err := json.Unmarshal(body, &e); err != nil {
			return err
		}
		return st.applyLedgerEvent(ctx, tx, balances, ledger, e)
	}
	mw, err := idempotent.New(st.db, st.d, "ledger", idempotent.WithTable(claims),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			return apply(ctx, tx, p.Payload)
		}}))
	if err != nil {
		return nil, err
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	err = deliverAll(ctx, deliveries, workers, func(ctx context.Context, e ledgerEvent) error {
		body, err := json.Marshal(e)
		if err != nil {
			return err
		}
		outcome, err := mw.ProcessMessage(ctx, idempotent.Message{Key: e.key(), OrderKey: e.orderKey(), OrderSeq: e.Seq, Payload: body},
			func(ctx context.Context, tx *sql.Tx) error { return apply(ctx, tx, body) })
		if outcome == idempotent.Parked {
			mu.Lock()
			lib.parked++
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("library run: %w", err)
	}
	if err := st.auditLedger(ctx, ledger, &lib); err != nil {
		return nil, err
	}
	waiting, err := mw.Waiting(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range waiting {
		lib.leftParked += w.Parked
	}

	audits := []orderedAudit{naive, lib}
	fmt.Fprintf(out, "%-24s %7s %8s %6s %13s %11s %7s\n", "", "EVENTS", "APPLIED", "TWICE", "OUT OF ORDER", "OVERDRAFTS", "PARKED")
	for _, a := range audits {
		parked := "-"
		if a.name != naive.name {
			parked = fmt.Sprintf("%d (%d left)", a.parked, a.leftParked)
		}
		fmt.Fprintf(out, "%-24s %7d %8d %6d %13d %11d %7s\n", a.name, a.events, a.applied, a.twice, a.outOfOrder, a.overdrafts, parked)
	}
	fmt.Fprintln(out, "\nOVERDRAFTS: effects that left a balance below zero, which no account reaches when its events apply in order.")
	return audits, nil
}
