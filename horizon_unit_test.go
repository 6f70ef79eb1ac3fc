package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// Unit tests of the retention horizon's sequencing on go-sqlmock: the claim
// that reads the horizon, the read after a batch's new claims, Cleanup and
// MaintainPartitions raising it before they delete, and a missing partition
// told apart by it.

// noPartition is Postgres's error for a row no partition accepts.
var noPartition = &pq.Error{Code: "23514", Message: "no partition of relation found for row"}

// handlerNotRun is a handler that fails the test if it runs.
func handlerNotRun(t *testing.T) func(context.Context, *sql.Tx) error {
	return func(context.Context, *sql.Tx) error {
		t.Error("the handler ran")
		return nil
	}
}

// TestHorizonRefusesAClaim: the claim statement inserts nothing and returns
// a horizon after the message's fence, so the delivery fails with
// ErrBeyondRetention, rolls back and commits nothing; the message is inside
// this Middleware's own window.
func TestHorizonRefusesAClaim(t *testing.T) {
	ctx := context.Background()
	at := msgNow.Add(-30 * time.Hour) // the 17th, inside the default window
	t.Run("plain: fenced by the event time less the clock-skew margin", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMessageMiddleware(t, r, idempotent.WithObserver(ev))
		fence := at.Add(-idempotent.DefaultClockSkew).UTC()
		h := fence.Add(time.Second) // a cleanup forgot claims processed up to a second after the fence
		r.mock.ExpectBegin()
		r.mock.ExpectExec(horizonClaimSQL).WithArgs(consumer, key, fence).WillReturnResult(notInserted)
		expectHorizon(r.mock, &h)
		r.mock.ExpectRollback()
		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, handlerNotRun(t))
		if got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) || !strings.Contains(err.Error(), "older than the retention horizon of processed_messages") {
			t.Fatalf("got (%v, %v), want ErrBeyondRetention naming the horizon", got, err)
		}
		r.wantCalls(t, "BEGIN", horizonClaimSQL, horizonSQL, "ROLLBACK")
		if e := ev.only(t); !errors.Is(e.Err, idempotent.ErrBeyondRetention) {
			t.Fatalf("event %+v, want ErrBeyondRetention", e)
		}
	})
	t.Run("partitioned: fenced by the event day", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		h := msgNow.Truncate(24 * time.Hour) // the days before the 18th were dropped
		r.mock.ExpectBegin()
		expectClaimAtQuery(r.mock, key, at).WillReturnResult(notInserted)
		expectHorizon(r.mock, &h)
		r.mock.ExpectRollback()
		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, handlerNotRun(t))
		if got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) || !strings.Contains(err.Error(), "the days before 2031-03-18 were dropped") {
			t.Fatalf("got (%v, %v), want ErrBeyondRetention naming the dropped days", got, err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK")
	})
	t.Run("ClaimMessage in the caller's transaction", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		h := msgNow.Truncate(24 * time.Hour)
		r.mock.ExpectBegin()
		expectClaimAtQuery(r.mock, key, at).WillReturnResult(notInserted)
		expectHorizon(r.mock, &h)
		r.mock.ExpectRollback()
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: key, EventTime: at}); ok || !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Fatalf("got (%v, %v), want ErrBeyondRetention", ok, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK")
	})
}

// TestHorizonNotInsertedIsDuplicate: a claim that inserted nothing while the
// horizon it read was none, older than the fence or equal to it, exists: a
// duplicate, not a refusal.
func TestHorizonNotInsertedIsDuplicate(t *testing.T) {
	ctx := context.Background()
	at := msgNow.Add(-30 * time.Hour)
	fence := at.Add(-idempotent.DefaultClockSkew).UTC()
	day := at.Truncate(24 * time.Hour)
	older := fence.Add(-time.Hour)
	for _, c := range []struct {
		name    string
		opts    []idempotent.Option
		horizon *time.Time
	}{
		{"plain, no horizon", nil, nil},
		{"plain, an older horizon", nil, &older},
		{"plain, the horizon at the fence", nil, &fence},
		{"partitioned, no horizon", []idempotent.Option{partitioned()}, nil},
		{"partitioned, the horizon at the event day", []idempotent.Option{partitioned()}, &day},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, c.opts...)
			stmt := horizonClaimSQL
			r.mock.ExpectBegin()
			if len(c.opts) > 0 {
				stmt = claimAtSQL
				expectClaimAtQuery(r.mock, key, at).WillReturnResult(notInserted)
			} else {
				r.mock.ExpectExec(horizonClaimSQL).WithArgs(consumer, key, fence).WillReturnResult(notInserted)
			}
			expectHorizon(r.mock, c.horizon)
			r.mock.ExpectRollback()
			if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, handlerNotRun(t)); err != nil || got != idempotent.Duplicate {
				t.Fatalf("got (%v, %v), want duplicate", got, err)
			}
			r.wantCalls(t, "BEGIN", stmt, horizonSQL, "ROLLBACK")
		})
	}
}

// TestHorizonNoEventTime: a message without an event time, which no
// horizon can refuse, takes the plain claim: nothing reads the horizon.
func TestHorizonNoEventTime(t *testing.T) {
	ctx := context.Background()
	for _, inserted := range []int64{1, 0} {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r)
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, inserted)
		want, calls := idempotent.Duplicate, []string{"BEGIN", claimSQL, "ROLLBACK"}
		if inserted == 1 {
			expectEffect(r.mock)
			r.mock.ExpectCommit()
			want, calls = idempotent.Applied, []string{"BEGIN", claimSQL, effectSQL, "COMMIT"}
		} else {
			r.mock.ExpectRollback()
		}
		if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != want {
			t.Fatalf("inserted %d: got (%v, %v), want %v", inserted, got, err, want)
		}
		r.wantCalls(t, calls...)
	}
}

// TestHorizonFencesTheBatch: a batch's claim statement does not read the
// horizon, so its new claims with event times are followed by the read, in
// the transaction; a new claim older than the horizon fails the batch with
// a BatchKeyError naming its first message, and nothing is committed. A
// duplicate older than the horizon refuses nothing.
func TestHorizonFencesTheBatch(t *testing.T) {
	ctx := context.Background()
	day1 := msgNow.Add(-48 * time.Hour) // the 16th
	day2 := msgNow.Add(-time.Hour)      // the 18th
	msgs := []idempotent.Message{
		{Key: "c", EventTime: day2},
		{Key: "b"}, // no event time: never refused
		{Key: "a", EventTime: day1},
		{Key: "a", EventTime: day1}, // a redelivery in the batch
	}
	plainH := day1.Add(time.Hour)                          // after day1's fence, before day2's
	partH := day2.Truncate(24 * time.Hour).Add(-time.Hour) // the 17th, 23:00: the 16th is gone
	for _, c := range []struct {
		name    string
		opts    []idempotent.Option
		horizon time.Time
		stmt    string
		expect  func(m sqlmock.Sqlmock, fresh ...string)
	}{
		{"plain", nil, plainH, batchSQL, func(m sqlmock.Sqlmock, fresh ...string) {
			rows := sqlmock.NewRows([]string{"message_key"})
			for _, k := range fresh {
				rows.AddRow(k)
			}
			m.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b", "c"})).WillReturnRows(rows)
		}},
		{"partitioned", []idempotent.Option{partitioned()}, partH, batchAtSQL, func(m sqlmock.Sqlmock, fresh ...string) {
			expectBatchClaimAt(m, []string{"a", "b", "c"}, []time.Time{day1, day2, day2}, fresh...)
		}},
	} {
		batch := msgs
		if c.opts != nil { // every message needs its event time
			batch = slices.Clone(msgs)
			batch[1].EventTime = day2
		}
		t.Run(c.name+": a new claim older than the horizon", func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, c.opts...)
			r.mock.ExpectBegin()
			c.expect(r.mock, "a", "b", "c")
			expectHorizon(r.mock, &c.horizon)
			r.mock.ExpectRollback()
			outs, err := mw.ProcessMessages(ctx, batch, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran")
				return nil
			})
			var be *idempotent.BatchKeyError
			if outs != nil || !errors.As(err, &be) || be.Index != 2 || !errors.Is(err, idempotent.ErrBeyondRetention) || !strings.Contains(err.Error(), `key "a"`) {
				t.Fatalf("got (%v, %v), want a *BatchKeyError at 2 (key a) matching ErrBeyondRetention", outs, err)
			}
			r.wantCalls(t, "BEGIN", c.stmt, horizonSQL, "ROLLBACK")
		})
		t.Run(c.name+": the old claim exists", func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, c.opts...)
			r.mock.ExpectBegin()
			c.expect(r.mock, "c")
			expectHorizon(r.mock, &c.horizon)
			expectEffect(r.mock)
			r.mock.ExpectCommit()
			outs, err := mw.ProcessMessages(ctx, batch, func(ctx context.Context, tx *sql.Tx, _ []int) error { return effect(ctx, tx) })
			want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}
			if err != nil || !slices.Equal(outs, want) {
				t.Fatalf("got (%v, %v), want %v", outs, err, want)
			}
			r.wantCalls(t, "BEGIN", c.stmt, horizonSQL, effectSQL, "COMMIT")
		})
	}
	t.Run("no new claim with an event time: no read", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b", "c"})).WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("b"))
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		if _, err := mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, _ []int) error { return effect(ctx, tx) }); err != nil {
			t.Fatal(err)
		}
		r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT")
	})
}

// TestHorizonTellsAMissingPartition: a claim that meets no partition for
// its day is ErrBeyondRetention when the horizon, read afterwards, says the
// day was dropped, and ErrNoPartition when it was not created yet.
func TestHorizonTellsAMissingPartition(t *testing.T) {
	ctx := context.Background()
	at := msgNow.Add(-30 * time.Hour)          // the 17th
	dropped := msgNow.Truncate(24 * time.Hour) // the 17th is gone
	kept := at.Truncate(24 * time.Hour)        // the 17th is kept
	for _, c := range []struct {
		name    string
		horizon *time.Time
		want    error
		notWant error
	}{
		{"before the horizon", &dropped, idempotent.ErrBeyondRetention, idempotent.ErrNoPartition},
		{"at the horizon", &kept, idempotent.ErrNoPartition, idempotent.ErrBeyondRetention},
		{"no horizon", nil, idempotent.ErrNoPartition, idempotent.ErrBeyondRetention},
	} {
		t.Run("claim, "+c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, partitioned())
			r.mock.ExpectBegin()
			expectClaimAtQuery(r.mock, key, at).WillReturnError(noPartition)
			expectHorizon(r.mock, c.horizon)
			r.mock.ExpectRollback()
			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, handlerNotRun(t))
			if !errors.Is(err, c.want) || errors.Is(err, c.notWant) || !errors.Is(err, noPartition) {
				t.Fatalf("got %v, want %v (not %v) wrapping the database's error", err, c.want, c.notWant)
			}
			r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK")
		})
		t.Run("batch, "+c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, partitioned())
			later := msgNow.Add(-time.Hour)
			r.mock.ExpectBegin()
			days := pg.BatchKeysArg([]string{later.Format(time.DateOnly), at.Format(time.DateOnly)})
			r.mock.ExpectQuery(batchAtSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b"}), days).WillReturnError(noPartition)
			expectHorizon(r.mock, c.horizon)
			calls := []string{"BEGIN", batchAtSQL, horizonSQL}
			r.mock.ExpectRollback()
			_, err := mw.ProcessMessages(ctx, []idempotent.Message{{Key: "b", EventTime: at}, {Key: "a", EventTime: later}}, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran")
				return nil
			})
			var be *idempotent.BatchKeyError
			if !errors.Is(err, c.want) || errors.Is(err, c.notWant) || !errors.Is(err, noPartition) || (c.want == idempotent.ErrBeyondRetention) != (errors.As(err, &be) && be.Index == 0) {
				t.Fatalf("got %v, want %v (not %v; beyond retention: a *BatchKeyError at 0)", err, c.want, c.notWant)
			}
			r.wantCalls(t, append(calls, "ROLLBACK")...)
		})
		// On Postgres the failed claim aborts the transaction, so the
		// horizon cannot be read in it: it is read from the pool once the
		// transaction is rolled back, never while it holds a connection.
		t.Run("claim, aborted transaction, "+c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, partitioned())
			r.mock.ExpectBegin()
			expectClaimAtQuery(r.mock, key, at).WillReturnError(noPartition)
			r.mock.ExpectQuery(horizonSQL).WithArgs(consumer).WillReturnError(aborted)
			r.mock.ExpectRollback()
			expectHorizon(r.mock, c.horizon)
			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, handlerNotRun(t))
			if !errors.Is(err, c.want) || errors.Is(err, c.notWant) || !errors.Is(err, noPartition) {
				t.Fatalf("got %v, want %v (not %v) wrapping the database's error", err, c.want, c.notWant)
			}
			r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK", horizonSQL)
		})
		t.Run("batch, aborted transaction, "+c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, partitioned())
			later := msgNow.Add(-time.Hour)
			r.mock.ExpectBegin()
			days := pg.BatchKeysArg([]string{later.Format(time.DateOnly), at.Format(time.DateOnly)})
			r.mock.ExpectQuery(batchAtSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b"}), days).WillReturnError(noPartition)
			r.mock.ExpectQuery(horizonSQL).WithArgs(consumer).WillReturnError(aborted)
			r.mock.ExpectRollback()
			expectHorizon(r.mock, c.horizon)
			_, err := mw.ProcessMessages(ctx, []idempotent.Message{{Key: "b", EventTime: at}, {Key: "a", EventTime: later}}, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran")
				return nil
			})
			var be *idempotent.BatchKeyError
			if !errors.Is(err, c.want) || errors.Is(err, c.notWant) || !errors.Is(err, noPartition) || (c.want == idempotent.ErrBeyondRetention) != (errors.As(err, &be) && be.Index == 0) {
				t.Fatalf("got %v, want %v (not %v; beyond retention: a *BatchKeyError at 0)", err, c.want, c.notWant)
			}
			r.wantCalls(t, "BEGIN", batchAtSQL, horizonSQL, "ROLLBACK", horizonSQL)
		})
	}
}

// TestHorizonCleanupRaisesItFirst: Cleanup raises the table's horizon to its
// cutoff in a transaction of its own, waits until no session runs on an
// older snapshot, and only then deletes, raising it again in each batch's
// transaction (TestClaimTableCleanup scripts that); old snapshots that
// outlast DrainTimeout stop it with ErrOldSnapshots before anything is
// deleted, and so does a horizon that cannot be raised.
func TestHorizonCleanupRaisesItFirst(t *testing.T) {
	ctx := context.Background()
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize, opts.MinBatchSize = 1000, 10
	t.Run("old snapshots outlast the drain timeout", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		short := opts
		short.DrainTimeout = time.Nanosecond
		calls := []string{expectTableKind(r.mock, shopClaims, true, false)}
		calls = append(calls, expectRaiseHorizon(r.mock, shopClaims, "analytics", tableCutoff, 1)...)
		n, err := tab.CleanupConsumer(ctx, "analytics", short)
		if n != 0 || !errors.Is(err, idempotent.ErrOldSnapshots) || !strings.Contains(err.Error(), "nothing deleted") {
			t.Fatalf("CleanupConsumer = (%d, %v), want ErrOldSnapshots with nothing deleted", n, err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("the horizon cannot be raised", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		kind := expectTableKind(r.mock, shopClaims, true, false)
		adv, args := pg.AdvanceHorizonSQL(shopClaims, "", tableCutoff)
		r.mock.ExpectBegin()
		r.mock.ExpectExec(adv).WithArgs(driverValues(args)...).WillReturnError(&pq.Error{Code: "42P01"})
		r.mock.ExpectRollback()
		n, err := tab.Cleanup(ctx, opts)
		if n != 0 || !errors.Is(err, idempotent.ErrNoClaimTable) || !strings.Contains(err.Error(), "raise the retention horizon of shop.claims") {
			t.Fatalf("Cleanup = (%d, %v), want ErrNoClaimTable from the horizon's raise", n, err)
		}
		r.wantCalls(t, kind, "BEGIN", adv, "ROLLBACK")
	})
}

// day is a UTC midnight of March 2031, the month of the ClaimTable tests.
func day(d int) time.Time { return time.Date(2031, 3, d, 0, 0, 0, 0, time.UTC) }

// part is one row of the Postgres dialect's partition list.
type part struct {
	day      time.Time
	attached bool
}

// expectListPartitions scripts the list of shop.claims's partitions and
// returns the query.
func expectListPartitions(m sqlmock.Sqlmock, parts []part) string {
	q, args := pg.ListPartitionsSQL(shopClaims)
	rows := sqlmock.NewRows([]string{"relname", "attached"})
	for _, p := range parts {
		rows.AddRow(pg.PartitionName(shopClaims, p.day), p.attached)
	}
	m.ExpectQuery(q).WithArgs(driverValues(args)...).WillReturnRows(rows)
	return q
}

// expectMaintenanceTx scripts one transaction of MaintainPartitions: the
// lock, the partitions as they are, and stmt under the lock timeout.
func expectMaintenanceTx(m sqlmock.Sqlmock, parts []part, stmt string) []string {
	lock := pg.MaintenanceLockSQL(shopClaims)
	timeout := pg.LockTimeoutSQL(idempotent.PartitionLockTimeout)
	m.ExpectBegin()
	m.ExpectExec(lock).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	list := expectListPartitions(m, parts)
	m.ExpectExec(timeout).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectExec(stmt).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectCommit()
	return []string{"BEGIN", lock, list, timeout, stmt, "COMMIT"}
}

// expectMaintainStart scripts what MaintainPartitions reads before it
// changes anything: the table's kind, its partitions and the table's own
// horizon, h (nil: none recorded).
func expectMaintainStart(m sqlmock.Sqlmock, parts []part, h *time.Time) []string {
	calls := []string{expectTableKind(m, shopClaims, true, true), expectTableKind(m, shopClaims, true, true), expectListPartitions(m, parts)}
	q, args := pg.HorizonSQL(shopClaims, "")
	var v any
	if h != nil {
		v = h.UnixMicro()
	}
	m.ExpectQuery(q).WithArgs(driverValues(args)...).WillReturnRows(sqlmock.NewRows([]string{"horizon"}).AddRow(v))
	return append(calls, q)
}

// TestHorizonMaintainPartitions: MaintainPartitions never creates a day the
// table's horizon says was dropped, whatever its own window says, and
// raises the horizon past the days it drops, and waits for older
// snapshots, before it detaches or drops any.
func TestHorizonMaintainPartitions(t *testing.T) {
	ctx := context.Background()
	// Its window (2 days and the margin, one day ahead) covers the 12th to
	// the 15th.
	opts := []idempotent.TableOption{idempotent.WithRetention(48 * time.Hour), idempotent.WithDailyPartitions(1)}
	names := func(ps []idempotent.Partition) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	t.Run("no day before the horizon is created", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r, opts...)
		h := day(14) // a shorter window dropped the 13th and before
		calls := expectMaintainStart(r.mock, nil, &h)
		calls = append(calls, expectMaintenanceTx(r.mock, nil, pg.CreatePartitionSQL(shopClaims, day(14)))...)
		calls = append(calls, expectMaintenanceTx(r.mock, []part{{day(14), true}}, pg.CreatePartitionSQL(shopClaims, day(15)))...)
		rep, err := tab.MaintainPartitions(ctx)
		if err != nil || !slices.Equal(names(rep.Created), []string{"claims_p20310314", "claims_p20310315"}) || len(rep.Dropped) != 0 {
			t.Fatalf("MaintainPartitions = (%+v, %v), want the 14th and 15th created", rep, err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("the horizon is raised before a drop", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r, opts...)
		all := []part{{day(10), true}, {day(11), true}, {day(12), true}, {day(13), true}, {day(14), true}, {day(15), true}}
		calls := expectMaintainStart(r.mock, all, nil)
		calls = append(calls, expectRaiseHorizon(r.mock, shopClaims, "", day(12), 0)...) // past the 11th, the last day dropped
		cur := slices.Clone(all)
		for _, d := range []time.Time{day(10), day(11)} {
			name := pg.PartitionName(shopClaims, d)
			calls = append(calls, expectMaintenanceTx(r.mock, cur, pg.DetachPartitionSQL(shopClaims, name))...)
			cur[0].attached = false
			calls = append(calls, expectMaintenanceTx(r.mock, cur, pg.DropPartitionSQL(shopClaims, name))...)
			cur = cur[1:]
		}
		rep, err := tab.MaintainPartitions(ctx)
		if err != nil || len(rep.Created) != 0 || !slices.Equal(names(rep.Dropped), []string{"claims_p20310310", "claims_p20310311"}) {
			t.Fatalf("MaintainPartitions = (%+v, %v), want the 10th and 11th dropped", rep, err)
		}
		r.wantCalls(t, calls...)
	})
}
