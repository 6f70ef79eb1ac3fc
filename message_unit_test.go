package idempotent_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// Unit tests of the Message entry points: ProcessMessage, ProcessMessages,
// ProcessMessageTx, ClaimMessage and the Wrap functions, with and without
// event times, in plain and partitioned mode.

var (
	// msgNow is the clock of these tests.
	msgNow     = time.Date(2031, 3, 18, 12, 0, 0, 0, time.UTC)
	claimAtSQL = pg.HorizonClaimSQL(dialect.Table{Name: idempotent.DefaultTable}, true)
	batchSQL   = pg.BatchClaimSQL(dialect.Table{Name: idempotent.DefaultTable})
	batchAtSQL = pg.PartitionedBatchClaimSQL(dialect.Table{Name: idempotent.DefaultTable})
	// horizonSQL is the read of the consumer's retention horizon that
	// follows a batch's new claims with event times.
	horizonSQL, _ = pg.HorizonSQL(dialect.Table{Name: idempotent.DefaultTable}, consumer)
)

// newMessageMiddleware returns a Middleware whose clock reads msgNow.
func newMessageMiddleware(t *testing.T, r *recorded, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	return newMiddleware(t, r, append([]idempotent.Option{idempotent.WithClock(func() time.Time { return msgNow })}, opts...)...)
}

func partitioned() idempotent.Option { return idempotent.WithDailyPartitions(2) }

// expectClaimAt scripts a partitioned claim of k on at's day, inserting
// rows (1 or 0); when it inserts nothing, the read of the horizon that
// tells a duplicate from a refusal follows, answering none recorded.
func expectClaimAt(m sqlmock.Sqlmock, k string, at time.Time, rows int64) {
	expectClaimAtQuery(m, k, at).WillReturnResult(sqlmock.NewResult(0, rows))
	if rows == 0 {
		expectHorizon(m, nil)
	}
}

// expectClaimAtQuery expects the partitioned claim of k on at's day: its
// fence is the day's UTC midnight.
func expectClaimAtQuery(m sqlmock.Sqlmock, k string, at time.Time) *sqlmock.ExpectedExec {
	day := at.UTC().Truncate(24 * time.Hour)
	return m.ExpectExec(claimAtSQL).WithArgs(consumer, k, day.Format(time.DateOnly), day)
}

// expectHorizon scripts the read of the consumer's retention horizon: h, or
// none recorded when h is nil.
func expectHorizon(m sqlmock.Sqlmock, h *time.Time) {
	var v driver.Value
	if h != nil {
		v = h.UnixMicro()
	}
	m.ExpectQuery(horizonSQL).WithArgs(consumer).WillReturnRows(sqlmock.NewRows([]string{"horizon"}).AddRow(v))
}

// expectBatchClaimAt scripts the partitioned batch claim of keys, each on
// the day of the time at the same index, inserting those in fresh.
func expectBatchClaimAt(m sqlmock.Sqlmock, keys []string, ats []time.Time, fresh ...string) {
	days := make([]string, len(ats))
	for i, at := range ats {
		days[i] = at.UTC().Format(time.DateOnly)
	}
	rows := sqlmock.NewRows([]string{"message_key"})
	for _, k := range fresh {
		rows.AddRow(k)
	}
	m.ExpectQuery(batchAtSQL).WithArgs(consumer, pg.BatchKeysArg(keys), pg.BatchKeysArg(days)).WillReturnRows(rows)
}

func TestProcessMessage(t *testing.T) {
	ctx := context.Background()
	yesterday := msgNow.Add(-24 * time.Hour)
	t.Run("partitioned: the event day chooses the partition", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		r.mock.ExpectBegin()
		expectClaimAt(r.mock, key, yesterday, 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: yesterday}, effect)
		if err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, effectSQL, "COMMIT")
	})
	t.Run("plain: a zero event time is unknown, not refused", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r)
		expectApplied(r.mock, key)
		if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	})
	refused := []struct {
		name string
		opts []idempotent.Option
		at   time.Time
		want error
	}{
		{"partitioned: zero event time", []idempotent.Option{partitioned()}, time.Time{}, idempotent.ErrInvalidEventTime},
		{"beyond retention", nil, msgNow.Add(-idempotent.DefaultRetention - time.Second), idempotent.ErrBeyondRetention},
		{"partitioned: beyond retention", []idempotent.Option{partitioned()}, msgNow.Add(-idempotent.DefaultRetention - time.Second), idempotent.ErrBeyondRetention},
		{"in the future", nil, msgNow.Add(idempotent.DefaultClockSkew + time.Second), idempotent.ErrInvalidEventTime},
	}
	for _, c := range refused {
		t.Run(c.name+": nothing sent", func(t *testing.T) {
			r := newRecorded(t)
			ev := &events{}
			mw := newMessageMiddleware(t, r, append(c.opts, idempotent.WithObserver(ev))...)
			got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: c.at}, func(context.Context, *sql.Tx) error {
				t.Error("the handler ran")
				return nil
			})
			if got != 0 || !errors.Is(err, c.want) {
				t.Fatalf("got (%v, %v), want %v", got, err, c.want)
			}
			r.wantCalls(t)
			if e := ev.only(t); e.Key != key || !errors.Is(e.Err, c.want) {
				t.Fatalf("event %+v", e)
			}
		})
	}
}

func TestProcessMessages(t *testing.T) {
	ctx := context.Background()
	day1 := msgNow.Add(-48 * time.Hour)
	day2 := msgNow.Add(-time.Hour)
	t.Run("partitioned: one claim statement, each key in its own day, in key order", func(t *testing.T) {
		r := newRecorded(t)
		ev := &events{}
		mw := newMessageMiddleware(t, r, partitioned(), idempotent.WithObserver(ev))
		msgs := []idempotent.Message{
			{Key: "c", EventTime: day2},
			{Key: "a", EventTime: day1},
			{Key: "b", EventTime: day2},
			{Key: "a", EventTime: day1.Add(time.Minute)}, // a redelivery in the batch: same day
		}
		r.mock.ExpectBegin()
		expectBatchClaimAt(r.mock, []string{"a", "b", "c"}, []time.Time{day1, day2, day2}, "a", "c")
		expectHorizon(r.mock, nil)
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		var fresh []int
		outs, err := mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, f []int) error {
			fresh = f
			return effect(ctx, tx)
		})
		want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate}
		if err != nil || !slices.Equal(outs, want) || !slices.Equal(fresh, []int{0, 1}) {
			t.Fatalf("got (%v, %v), fresh %v; want %v, fresh [0 1]", outs, err, fresh, want)
		}
		r.wantCalls(t, "BEGIN", batchAtSQL, horizonSQL, effectSQL, "COMMIT")
		if len(ev.outcomes) != 4 || ev.outcomes[0].Key != "c" || ev.outcomes[0].Outcome != idempotent.Applied {
			t.Fatalf("events %+v", ev.outcomes)
		}
	})
	t.Run("partitioned: a day without its partition fails the batch", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchAtSQL).WithArgs(consumer, sqlmock.AnyArg(), sqlmock.AnyArg()).WillReturnError(&pq.Error{Code: "23514"})
		// None recorded, so no day was dropped.
		expectHorizon(r.mock, nil)
		r.mock.ExpectRollback()
		_, err := mw.ProcessMessages(ctx, []idempotent.Message{{Key: "b", EventTime: day2}, {Key: "a", EventTime: day1}, {Key: "c", EventTime: day2}}, func(context.Context, *sql.Tx, []int) error {
			t.Error("the handler ran")
			return nil
		})
		days := day1.Format(time.DateOnly) + ", " + day2.Format(time.DateOnly)
		if !errors.Is(err, idempotent.ErrNoPartition) || !strings.Contains(err.Error(), "event days "+days+" yet") {
			t.Fatalf("got %v, want ErrNoPartition naming the days %s once each", err, days)
		}
		r.wantCalls(t, "BEGIN", batchAtSQL, horizonSQL, "ROLLBACK")
	})
	t.Run("plain: one statement for the batch, event times fenced", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r)
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, sqlmock.AnyArg()).WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("b"))
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		outs, err := mw.ProcessMessages(ctx, []idempotent.Message{{Key: "a", EventTime: day1}, {Key: "b"}}, func(ctx context.Context, tx *sql.Tx, _ []int) error { return effect(ctx, tx) })
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Applied}) {
			t.Fatalf("got (%v, %v)", outs, err)
		}
		r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT")
	})
	refused := []struct {
		name  string
		opts  []idempotent.Option
		msgs  []idempotent.Message
		index int
		want  error
	}{
		{"beyond retention", nil,
			[]idempotent.Message{{Key: "a", EventTime: day1}, {Key: "b", EventTime: msgNow.Add(-idempotent.DefaultRetention - time.Hour)}}, 1, idempotent.ErrBeyondRetention},
		{"partitioned: beyond retention", []idempotent.Option{partitioned()},
			[]idempotent.Message{{Key: "a", EventTime: day1}, {Key: "b", EventTime: day2}, {Key: "c", EventTime: msgNow.Add(-idempotent.DefaultRetention - time.Hour)}}, 2, idempotent.ErrBeyondRetention},
		{"in the future", []idempotent.Option{partitioned()},
			[]idempotent.Message{{Key: "a", EventTime: msgNow.Add(time.Hour)}, {Key: "b", EventTime: day2}}, 0, idempotent.ErrInvalidEventTime},
		{"partitioned: zero event time", []idempotent.Option{partitioned()},
			[]idempotent.Message{{Key: "a", EventTime: day1}, {Key: "b"}}, 1, idempotent.ErrInvalidEventTime},
		{"partitioned: one key on two days", []idempotent.Option{partitioned()},
			[]idempotent.Message{{Key: "a", EventTime: day1}, {Key: "b", EventTime: day1}, {Key: "a", EventTime: day2}}, 2, idempotent.ErrInvalidEventTime},
		{"invalid key", []idempotent.Option{partitioned()},
			[]idempotent.Message{{Key: "a", EventTime: day1}, {Key: "", EventTime: day1}}, 1, idempotent.ErrInvalidKey},
	}
	for _, c := range refused {
		t.Run(c.name+": the whole batch refused, nothing sent", func(t *testing.T) {
			r := newRecorded(t)
			mw := newMessageMiddleware(t, r, c.opts...)
			outs, err := mw.ProcessMessages(ctx, c.msgs, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran")
				return nil
			})
			var be *idempotent.BatchKeyError
			if outs != nil || !errors.As(err, &be) || be.Index != c.index || !errors.Is(err, c.want) {
				t.Fatalf("got (%v, %v), want a *BatchKeyError at %d matching %v", outs, err, c.index, c.want)
			}
			r.wantCalls(t)
		})
	}
	t.Run("ProcessBatch in partitioned mode: no event times, refused", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		_, err := mw.ProcessMessages(ctx, keyMessages("a"), func(context.Context, *sql.Tx, []int) error { return nil })
		var be *idempotent.BatchKeyError
		if !errors.As(err, &be) || be.Index != 0 || !errors.Is(err, idempotent.ErrInvalidEventTime) || !strings.Contains(err.Error(), "partitioned by event day") {
			t.Fatalf("got %v", err)
		}
		r.wantCalls(t)
	})
}

func TestProcessMessageTx(t *testing.T) {
	ctx := context.Background()
	begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*myTx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		return &myTx{Tx: tx}, tx, err
	}
	at := msgNow.Add(-3 * time.Hour)
	t.Run("partitioned: event time through a caller's BeginFunc", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		r.mock.ExpectBegin()
		expectClaimAt(r.mock, key, at, 1)
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		got, err := idempotent.ProcessMessageTx(ctx, mw, idempotent.Message{Key: key, EventTime: at}, begin, func(ctx context.Context, tx *myTx) error {
			_, err := tx.ExecContext(ctx, effectSQL)
			return err
		})
		if err != nil || got != idempotent.Applied {
			t.Fatalf("got (%v, %v), want applied", got, err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, effectSQL, "COMMIT")
	})
	t.Run("beyond retention: nothing begun", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, idempotent.WithRetention(time.Hour))
		got, err := idempotent.ProcessMessageTx(ctx, mw, idempotent.Message{Key: key, EventTime: at}, begin, func(context.Context, *myTx) error {
			t.Error("the handler ran")
			return nil
		})
		if got != 0 || !errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Fatalf("got (%v, %v), want ErrBeyondRetention", got, err)
		}
		r.wantCalls(t)
	})
	t.Run("WrapMessageTx", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		r.mock.ExpectBegin()
		expectClaimAt(r.mock, key, at, 0)
		r.mock.ExpectRollback()
		handle := idempotent.WrapMessageTx(mw, func(at time.Time) (idempotent.Message, error) {
			return idempotent.Message{Key: key, EventTime: at}, nil
		}, begin, func(context.Context, *myTx, time.Time) error {
			t.Error("the handler ran for a duplicate")
			return nil
		})
		if got, err := handle(ctx, at); err != nil || got != idempotent.Duplicate {
			t.Fatalf("got (%v, %v), want duplicate", got, err)
		}
		r.wantCalls(t, "BEGIN", claimAtSQL, horizonSQL, "ROLLBACK")
		if _, err := idempotent.WrapMessageTx[time.Time, *myTx](mw, nil, begin, nil)(ctx, at); err == nil {
			t.Fatal("nil message function accepted")
		}
	})
}

func TestClaimMessage(t *testing.T) {
	ctx := context.Background()
	at := msgNow.Add(-time.Hour)
	r := newRecorded(t)
	mw := newMessageMiddleware(t, r, partitioned())
	r.mock.ExpectBegin()
	expectClaimAt(r.mock, "new", at, 1)
	expectClaimAt(r.mock, "old", at, 0)
	r.mock.ExpectRollback()
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "new", EventTime: at}); !ok || err != nil {
		t.Fatalf("new: got (%v, %v)", ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "old", EventTime: at}); ok || err != nil {
		t.Fatalf("old: got (%v, %v)", ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "zero"}); ok || !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("zero event time: got (%v, %v), want ErrInvalidEventTime", ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "old", EventTime: msgNow.AddDate(0, -2, 0)}); ok || !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("beyond retention: got (%v, %v), want ErrBeyondRetention", ok, err)
	}
	if _, err := mw.ClaimMessage(ctx, nil, idempotent.Message{Key: "new", EventTime: at}); err == nil || !strings.Contains(err.Error(), "nil transaction") {
		t.Fatalf("nil tx: got %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	r.wantCalls(t, "BEGIN", claimAtSQL, claimAtSQL, horizonSQL, "ROLLBACK")
}

// event is a decoded message of the Wrap tests.
type event struct {
	id string
	at time.Time
}

func eventMessage(e event) (idempotent.Message, error) {
	if e.id == "" {
		return idempotent.Message{}, errors.New("event has no id")
	}
	return idempotent.Message{Key: e.id, EventTime: e.at}, nil
}

func TestWrapMessage(t *testing.T) {
	ctx := context.Background()
	at := msgNow.Add(-time.Hour)
	r := newRecorded(t)
	mw := newMessageMiddleware(t, r, partitioned())
	r.mock.ExpectBegin()
	expectClaimAt(r.mock, key, at, 1)
	expectEffect(r.mock)
	r.mock.ExpectCommit()
	var seen event
	handle := idempotent.WrapMessage(mw, eventMessage, func(ctx context.Context, tx *sql.Tx, e event) error {
		seen = e
		return effect(ctx, tx)
	})
	if got, err := handle(ctx, event{id: key, at: at}); err != nil || got != idempotent.Applied || seen.id != key {
		t.Fatalf("got (%v, %v), handler saw %+v", got, err, seen)
	}
	if got, err := handle(ctx, event{}); got != 0 || !errors.Is(err, idempotent.ErrInvalidKey) || !strings.Contains(err.Error(), "event has no id") {
		t.Fatalf("message function fails: got (%v, %v), want ErrInvalidKey", got, err)
	}
	r.wantCalls(t, "BEGIN", claimAtSQL, effectSQL, "COMMIT")
	if _, err := idempotent.WrapMessage[event](mw, nil, nil)(ctx, event{}); err == nil {
		t.Fatal("nil message function accepted")
	}
}

func TestWrapMessages(t *testing.T) {
	ctx := context.Background()
	day1 := msgNow.Add(-30 * time.Hour)
	day2 := msgNow.Add(-time.Hour)
	t.Run("partitioned", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		r.mock.ExpectBegin()
		expectBatchClaimAt(r.mock, []string{"a", "b"}, []time.Time{day2, day1}, "b")
		expectHorizon(r.mock, nil)
		expectEffect(r.mock)
		r.mock.ExpectCommit()
		var seen []event
		handle := idempotent.WrapMessages(mw, eventMessage, func(ctx context.Context, tx *sql.Tx, es []event) error {
			seen = es
			return effect(ctx, tx)
		})
		outs, err := handle(ctx, []event{{id: "b", at: day1}, {id: "a", at: day2}})
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate}) || len(seen) != 1 || seen[0].id != "b" {
			t.Fatalf("got (%v, %v), handler saw %+v", outs, err, seen)
		}
		r.wantCalls(t, "BEGIN", batchAtSQL, horizonSQL, effectSQL, "COMMIT")
	})
	t.Run("message function fails: nothing sent", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMessageMiddleware(t, r, partitioned())
		handle := idempotent.WrapMessages(mw, eventMessage, func(context.Context, *sql.Tx, []event) error {
			t.Error("the handler ran")
			return nil
		})
		_, err := handle(ctx, []event{{id: "b", at: day1}, {}})
		var be *idempotent.BatchKeyError
		if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, idempotent.ErrInvalidKey) {
			t.Fatalf("got %v, want a *BatchKeyError at 1", err)
		}
		r.wantCalls(t)
	})
}

func TestCheckMessage(t *testing.T) {
	r := newRecorded(t)
	plain := newMessageMiddleware(t, r)
	parted := newMessageMiddleware(t, r, partitioned())
	for _, c := range []struct {
		name string
		mw   *idempotent.Middleware
		msg  idempotent.Message
		want error
	}{
		{"a key alone", plain, idempotent.Message{Key: key}, nil},
		{"an event time inside the window", parted, idempotent.Message{Key: key, EventTime: msgNow.Add(-time.Hour)}, nil},
		{"an empty key", plain, idempotent.Message{}, idempotent.ErrInvalidKey},
		{"a NUL byte", plain, idempotent.Message{Key: "a\x00b"}, idempotent.ErrInvalidKey},
		{"beyond retention", plain, idempotent.Message{Key: key, EventTime: msgNow.Add(-idempotent.DefaultRetention - time.Second)}, idempotent.ErrBeyondRetention},
		{"in the future", plain, idempotent.Message{Key: key, EventTime: msgNow.Add(idempotent.DefaultClockSkew + time.Second)}, idempotent.ErrInvalidEventTime},
		{"partitioned without an event time", parted, idempotent.Message{Key: key}, idempotent.ErrInvalidEventTime},
	} {
		err := c.mw.CheckMessage(c.msg)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: CheckMessage = %v, want %v", c.name, err, c.want)
		}
	}
	r.wantCalls(t) // nothing sent
}
