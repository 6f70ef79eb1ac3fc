package idempotent

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
)

func init() { claimfold.Register(newFold, newPath) }

// newFold is the claimfold.Builder: it folds m's claim statement with an
// adapter's companion statement when m's dialect is a dialect.ClaimFolder.
func newFold(mw any, companion func(first int) string) (*claimfold.Fold, bool) {
	m, ok := mw.(*Middleware)
	if !ok || m == nil {
		return nil, false
	}
	f, ok := m.d.(dialect.ClaimFolder)
	if !ok {
		return nil, false
	}
	first := 3 // consumer, key
	if m.ret.part != nil {
		first = 4 // and the event day
	}
	var q string
	if hf, ok := m.horizonFolder(); ok {
		q = hf.FoldHorizonClaimSQL(m.table, m.ret.part != nil, companion(first+1)) // after the fence
	} else {
		q = f.FoldClaimSQL(m.claimSQL, companion(first))
	}
	if q == "" {
		return nil, false
	}
	return claimfold.Make(q, m.foldedClaim), true
}

// foldedClaim is claimMessage — the same checks, lock timeout and error
// wrapping, through claimWith — with the claim statement replaced by stmt,
// the prepared folded statement, which also runs the companion with args.
// It returns the companion's row count and whether the claim was new.
func (m *Middleware) foldedClaim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error) {
	if tx == nil || stmt == nil {
		return 0, false, errors.New("idempotent: Claim: nil transaction or statement")
	}
	if err := m.checkMessage(Message{Key: key, EventTime: at}); err != nil {
		return 0, false, err
	}
	companion, claimed, err := m.foldedStatement(ctx, tx, nil, stmt, key, at, args)
	if err != nil {
		return 0, false, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	return companion, claimed, nil
}

// foldedStatement runs stmt, the prepared folded statement, through
// claimWith (st as there): the claim's arguments, then the companion's
// args. It returns the companion's row count and whether the claim was new.
func (m *Middleware) foldedStatement(ctx context.Context, tx *sql.Tx, st *attemptState, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error) {
	var companion int64
	claimed, err := m.claimWith(ctx, tx, st, func() (bool, error) {
		a := make([]any, 0, 3+len(args))
		a = append(a, m.consumerArg, key)
		if m.ret.part != nil {
			a = append(a, eventDay(at).Format(time.DateOnly))
		}
		_, folded := m.horizonFolder()
		if folded {
			a = append(a, m.ret.fence(at))
		}
		a = append(a, args...)
		var n int64
		var hv sql.NullInt64
		dest := []any{&companion, &n}
		if folded {
			dest = append(dest, &hv)
		}
		if err := tx.StmtContext(ctx, stmt).QueryRowContext(ctx, a...).Scan(dest...); err != nil {
			if rerr := m.retentionClaimError(ctx, tx, err, nil, at); rerr != nil {
				return false, rerr
			}
			return false, m.claimError(err)
		}
		if folded {
			if h, ok := horizonMicros(hv); n == 0 && ok && m.ret.beyond(at, h) {
				return false, m.beyondHorizon(key, at, h)
			}
		} else if n == 1 && m.hk != nil && !at.IsZero() {
			// The folded statement does not read the horizon: read it
			// after the insert, as a dialect without HorizonClaimer does.
			if _, err := m.checkHorizonAfterClaim(ctx, tx, []string{key}, []time.Time{at}); err != nil {
				return false, err
			}
		}
		return n == 1, nil
	})
	return companion, claimed, err
}

// horizonFolder returns m's dialect as a dialect.HorizonClaimFolder when
// it reads the horizon in its folded claims too.
func (m *Middleware) horizonFolder() (dialect.HorizonClaimFolder, bool) {
	if m.hclaimSQL == "" {
		return nil, false
	}
	hf, ok := m.d.(dialect.HorizonClaimFolder)
	return hf, ok
}

// path is the claimfold.Path of a Middleware: its own runner — transaction
// options, retry policy, strict guard, observer of retries — around a body
// the adapter writes.
type path struct {
	m *Middleware
	// run is m.run, except that the strict guard's check before COMMIT is
	// skipped in an attempt whose handler never ran (a duplicate, or the
	// adapter's own writes): there is no transaction id to compare, and
	// nothing of the caller's ran in the transaction.
	run runner
}

var _ claimfold.Path = (*path)(nil)

// newPath is the claimfold.PathBuilder.
func newPath(mw any) (claimfold.Path, bool) {
	m, ok := mw.(*Middleware)
	if !ok || m == nil {
		return nil, false
	}
	p := &path{m: m, run: m.run}
	if check := m.run.beforeCommit; check != nil {
		p.run.beforeCommit = func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
			if st.txid == "" {
				return nil
			}
			return check(ctx, tx, st)
		}
	}
	return p, true
}

// DB is claimfold.Path.DB.
func (p *path) DB() *sql.DB { return p.m.db }

// Process is claimfold.Path.Process.
func (p *path) Process(ctx context.Context, key string, at time.Time, body func(context.Context, claimfold.Attempt) error) (bool, error) {
	m := p.m
	if body == nil {
		return false, errors.New("idempotent: Process: nil function")
	}
	outcome, err := m.observe(ctx, key, func(ctx context.Context) (Outcome, int, error) {
		if err := m.checkMessage(Message{Key: key, EventTime: at}); err != nil {
			return 0, 0, err
		}
		return p.process(ctx, key, at, body)
	})
	return outcome == Applied, err
}

// process is Process after the checks and without the observer: what a
// coalesced delivery that finds itself alone runs (see pathCoalescer).
func (p *path) process(ctx context.Context, key string, at time.Time, body func(context.Context, claimfold.Attempt) error) (Outcome, int, error) {
	m := p.m
	a := &attempt{m: m, key: key, at: at}
	attempts, err := p.run.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		a.begin(ctx, tx, st)
		return body(ctx, a)
	})
	if err != nil {
		err = m.reclassify(ctx, err)
		return 0, attempts, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	if a.handled {
		return Applied, attempts, nil
	}
	return Duplicate, attempts, nil
}

// ProcessBatch is claimfold.Path.ProcessBatch.
func (p *path) ProcessBatch(ctx context.Context, keys []string, ats []time.Time, body func(context.Context, claimfold.Attempt) error) ([]bool, error) {
	m := p.m
	if body == nil {
		return nil, errors.New("idempotent: ProcessMessages: nil function")
	}
	if ats != nil && len(ats) != len(keys) {
		return nil, fmt.Errorf("idempotent: ProcessMessages: %d keys but %d event times", len(keys), len(ats))
	}
	if len(keys) == 0 {
		return nil, nil
	}
	msgs := make([]Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
		if ats != nil {
			msgs[i].EventTime = ats[i]
		}
	}
	start := time.Now()
	outcomes, attempts, err := p.batch(ctx, msgs, body)
	m.observeBatch(ctx, msgs, outcomes, attempts, time.Since(start), err)
	if err != nil {
		return nil, err
	}
	applied := make([]bool, len(outcomes))
	for i, o := range outcomes {
		applied[i] = o == Applied
	}
	return applied, nil
}

// batch checks and orders msgs as processMessages does, then runs body
// under the path's runner.
func (p *path) batch(ctx context.Context, msgs []Message, body func(context.Context, claimfold.Attempt) error) ([]Outcome, int, error) {
	m := p.m
	if len(msgs) > MaxBatchSize {
		return nil, 0, batchTooLarge(len(msgs))
	}
	for i, msg := range msgs {
		if err := m.checkMessage(msg); err != nil {
			return nil, 0, &BatchKeyError{Index: i, Err: err}
		}
		if err := refuseOrdered(msg, "a batch"); err != nil {
			return nil, 0, &BatchKeyError{Index: i, Err: err}
		}
	}
	uniq, first, err := m.batchKeys(msgs)
	if err != nil {
		return nil, 0, err
	}
	a := &attempt{m: m, batch: true, b: batchClaim{uniq: uniq, first: first, ats: make([]time.Time, len(uniq))}, isNew: make([]bool, len(uniq))}
	for j, i := range first {
		a.b.ats[j] = msgs[i].EventTime
	}
	if m.ret.part != nil {
		a.b.days = a.b.ats
	}
	attempts, err := p.run.run(ctx, "", func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		a.begin(ctx, tx, st)
		clear(a.isNew)
		return body(ctx, a)
	})
	if err != nil {
		err = m.reclassify(ctx, err)
		return nil, attempts, fmt.Errorf("idempotent: consumer %q, batch of %d: %w", m.consumer, len(msgs), err)
	}
	outcomes := make([]Outcome, len(msgs))
	for i := range outcomes {
		outcomes[i] = Duplicate
	}
	if a.handled {
		for j, ok := range a.isNew {
			if ok {
				outcomes[first[j]] = Applied
			}
		}
	}
	return outcomes, attempts, nil
}

// batchKeys returns the distinct keys of msgs in ascending order and, for
// each, the index of its first occurrence; in partitioned mode a key given
// twice with event times on different days is refused (*BatchKeyError at
// the later index), as the two would be claimed in different partitions.
func (m *Middleware) batchKeys(msgs []Message) (uniq []string, first []int, err error) {
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(strings.Compare(msgs[a].Key, msgs[b].Key), a-b) })
	uniq = make([]string, 0, len(msgs))
	first = make([]int, 0, len(msgs))
	for _, i := range order {
		n := len(uniq)
		if n == 0 || uniq[n-1] != msgs[i].Key {
			uniq, first = append(uniq, msgs[i].Key), append(first, i)
			continue
		}
		if f := msgs[first[n-1]]; m.ret.part != nil && !eventDay(f.EventTime).Equal(eventDay(msgs[i].EventTime)) {
			return nil, nil, &BatchKeyError{Index: i, Err: fmt.Errorf("%w: consumer %q, key %q: event day %s, but message %d with the same key has event day %s",
				ErrInvalidEventTime, m.consumer, msgs[i].Key, eventDay(msgs[i].EventTime).Format(time.DateOnly), first[n-1], eventDay(f.EventTime).Format(time.DateOnly))}
		}
	}
	return uniq, first, nil
}

// Tx is claimfold.Path.Tx.
func (p *path) Tx(ctx context.Context, body func(context.Context, *sql.Tx) error) error {
	if body == nil {
		return errors.New("idempotent: Tx: nil function")
	}
	_, err := p.run.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error { return body(ctx, tx) })
	return err
}

// attempt is a claimfold.Attempt: one attempt's transaction of a path's
// Process (key, at) or ProcessBatch (batch: uniq, first, days, isNew).
type attempt struct {
	m   *Middleware
	ctx context.Context
	tx  *sql.Tx
	st  *attemptState

	key string
	at  time.Time

	batch bool
	b     batchClaim
	isNew []bool

	claimed bool // this attempt took a new claim
	handled bool // this attempt ran the handler
}

var _ claimfold.Attempt = (*attempt)(nil)

func (a *attempt) begin(ctx context.Context, tx *sql.Tx, st *attemptState) {
	a.ctx, a.tx, a.st = ctx, tx, st
	a.claimed, a.handled = false, false
}

func (a *attempt) Tx() *sql.Tx { return a.tx }

func (a *attempt) Claim(stmt *sql.Stmt, args ...any) (int64, bool, error) {
	if a.batch || stmt == nil {
		return 0, false, errors.New("idempotent: Attempt.Claim: not a single message's attempt, or nil statement")
	}
	n, claimed, err := a.m.foldedStatement(a.ctx, a.tx, a.st, stmt, a.key, a.at, args)
	a.claimed = claimed
	return n, claimed, err
}

func (a *attempt) ClaimAfter(companion func() error) (bool, error) {
	if a.batch || companion == nil {
		return false, errors.New("idempotent: Attempt.ClaimAfter: not a single message's attempt, or nil companion")
	}
	if err := companion(); err != nil {
		return false, err
	}
	claimed, err := a.m.claimKey(a.ctx, a.tx, a.st, a.key, a.at)
	a.claimed = claimed
	return claimed, err
}

func (a *attempt) ClaimBatch(companion func() error) ([]int, error) {
	if !a.batch || companion == nil {
		return nil, errors.New("idempotent: Attempt.ClaimBatch: not a batch's attempt, or nil companion")
	}
	m := a.m
	claimed, err := m.claimWith(a.ctx, a.tx, a.st, func() (bool, error) {
		if err := companion(); err != nil {
			return false, err
		}
		return m.batchClaimStatements(a.ctx, a.tx, a.b, a.isNew)
	})
	if err != nil {
		return nil, err
	}
	a.claimed = claimed
	var fresh []int
	for j, ok := range a.isNew {
		if ok {
			fresh = append(fresh, a.b.first[j])
		}
	}
	slices.Sort(fresh)
	return fresh, nil
}

func (a *attempt) Handle(fn func(context.Context, *sql.Tx) error) error {
	if !a.claimed || fn == nil {
		return errors.New("idempotent: Attempt.Handle: no new claim in this attempt, or nil handler")
	}
	a.st.inHandler = true
	a.handled = true
	return fn(a.ctx, a.tx)
}
