package outbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent/dialect"
)

func mockDB(t *testing.T) (*Outbox, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ob, err := New(db, "shop")
	if err != nil {
		t.Fatal(err)
	}
	return ob, mock
}

func TestNewRejectsBadInput(t *testing.T) {
	ob, _ := mockDB(t)
	db := ob.db
	for _, tc := range []struct {
		name     string
		consumer string
		opts     []Option
		want     string
		is       error
	}{
		{"empty consumer", "", nil, "consumer name is empty", nil},
		{"consumer with a space", "my shop", nil, `consumer name "my shop" has ' '`, nil},
		{"consumer too long", strings.Repeat("c", 129), nil, "129 bytes, the limit is 128", nil},
		{"table with two dots", "shop", []Option{WithTable("a.b.c")}, "at most one dot", dialect.ErrInvalidIdentifier},
		{"table starting with a digit", "shop", []Option{WithTable("1outbox")}, `"1outbox" has '1' at byte 0`, dialect.ErrInvalidIdentifier},
		{"table with a quote", "shop", []Option{WithTable(`out"box`)}, `has '"'`, dialect.ErrInvalidIdentifier},
		{"empty table", "shop", []Option{WithTable("")}, "empty", dialect.ErrInvalidIdentifier},
		{"nil observer", "shop", []Option{WithObserver(nil)}, "nil observer", nil},
		{"zero cleanup batch", "shop", []Option{WithCleanupBatch(0)}, "not a positive batch size", nil},
		{"nil option", "shop", []Option{nil}, "nil option", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(db, tc.consumer, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("New: %v does not match %v", err, tc.is)
			}
		})
	}
	if _, err := New(nil, "shop"); err == nil {
		t.Error("New with a nil *sql.DB succeeded")
	}
	ob, err := New(db, "shop", WithTable("app.outbox"))
	if err != nil || ob.Table() != "app.outbox" || ob.Consumer() != "shop" || !strings.HasPrefix(ob.Channel(), "outbox_") {
		t.Errorf("New = %+v, %v", ob, err)
	}
}

func TestNewRelayRejectsBadInput(t *testing.T) {
	ob, _ := mockDB(t)
	nop := SenderFunc(func(context.Context, Message) error { return nil })
	send := WithSender("mail", nop)
	for _, tc := range []struct {
		name string
		opts []RelayOption
		want string
	}{
		{"no sender", nil, "no sender registered"},
		{"nil sender", []RelayOption{WithSender("mail", nil)}, "nil sender"},
		{"empty kind", []RelayOption{WithSender("", nop)}, "kind is empty"},
		{"kind twice", []RelayOption{send, WithSender("mail", nop)}, "registered twice"},
		{"nil option", []RelayOption{send, nil}, "nil option"},
		{"zero poll interval", []RelayOption{send, WithPollInterval(0)}, "WithPollInterval: 0s is not a positive duration"},
		{"negative lease", []RelayOption{send, WithLease(-time.Second)}, "WithLease: -1s"},
		{"sub-millisecond lease", []RelayOption{send, WithLease(time.Microsecond)}, "at least 1ms"},
		{"zero call timeout", []RelayOption{send, WithCallTimeout(0)}, "WithCallTimeout: 0s"},
		{"call timeout as long as the lease", []RelayOption{send, WithLease(time.Second), WithCallTimeout(time.Second)}, "must be shorter than the lease"},
		{"negative grace", []RelayOption{send, WithShutdownGrace(-1)}, "WithShutdownGrace: -1ns is negative"},
		{"zero concurrency", []RelayOption{send, WithConcurrency(0)}, "WithConcurrency: 0"},
		{"zero batch", []RelayOption{send, WithBatch(0)}, "WithBatch: 0"},
		{"zero attempts", []RelayOption{send, WithMaxAttempts(0)}, "WithMaxAttempts: 0"},
		{"zero backoff", []RelayOption{send, WithBackoff(Backoff{Max: time.Second})}, "Initial 0s is not a positive duration"},
		{"backoff max below initial", []RelayOption{send, WithBackoff(Backoff{Initial: time.Second, Max: time.Millisecond})}, "less than Initial"},
		{"empty listener DSN", []RelayOption{send, WithListener("")}, "empty connection string"},
		{"bad listener DSN", []RelayOption{send, WithListener("not a dsn")}, "WithListener: missing"},
		{"zero listener check", []RelayOption{send, WithListenerCheck(0)}, "WithListenerCheck: 0s is not positive"},
		{"negative listener check", []RelayOption{send, WithListenerCheck(-time.Second)}, "WithListenerCheck: -1s is not positive"},
		{"bad relay id", []RelayOption{send, WithRelayID("relay one")}, "relay id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRelay(ob, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewRelay: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := NewRelay(nil, send); err == nil {
		t.Error("NewRelay with a nil Outbox succeeded")
	}
}

func TestNewRelayDefaults(t *testing.T) {
	ob, _ := mockDB(t)
	nop := SenderFunc(func(context.Context, Message) error { return nil })
	r, err := NewRelay(ob, WithSender("sms", nop), WithSender("mail", nop))
	if err != nil {
		t.Fatal(err)
	}
	if r.lease != DefaultLease || r.callTimeout != DefaultLease/2 || r.grace != r.callTimeout ||
		r.poll != DefaultPollInterval || r.listenCheck != DefaultListenerCheck || r.maxAttempts != DefaultMaxAttempts || r.backoff != DefaultBackoff() ||
		r.concurrency != DefaultConcurrency || r.batch != DefaultBatch || r.id == "" || checkName("id", r.id) != nil {
		t.Errorf("defaults: %+v", r)
	}
	if strings.Join(r.kinds, ",") != "mail,sms" {
		t.Errorf("kinds %v, want [mail sms]", r.kinds)
	}
	r, err = NewRelay(ob, WithSender("mail", nop), WithLease(10*time.Second), WithShutdownGrace(0), WithRelayID("r1"), WithListenerCheck(time.Second))
	if err != nil || r.callTimeout != 5*time.Second || r.grace != 0 || r.ID() != "r1" || r.listenCheck != time.Second {
		t.Errorf("NewRelay = %+v, %v; want call timeout 5s from the lease, grace 0, id r1", r, err)
	}
	r2, err := NewRelay(ob, WithSender("mail", nop))
	if err != nil || r2.ID() == r.ID() {
		t.Errorf("two relays share the id %q", r2.ID())
	}
}

func TestRunTwiceAtOnce(t *testing.T) {
	ob, _ := mockDB(t)
	r, err := NewRelay(ob, WithSender("mail", SenderFunc(func(context.Context, Message) error { return nil })))
	if err != nil {
		t.Fatal(err)
	}
	r.running.Store(true)
	if err := r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run: %v, want already running", err)
	}
}

func TestKey(t *testing.T) {
	// The derivation is part of the stored data: a change would make a
	// redelivered message enqueue its call again under a new key.
	const want = "90b9a3d351a10dfcd053382f870f476cb1cc8109f9b0d20db23893aa89ca2a37" // sha256 of "idempotent-outbox-v1\x00receipts\x00send_receipt\x00order-completed:9912"
	got := Key("receipts", "order-completed:9912", "send_receipt")
	if len(got) != 64 || strings.Trim(got, "0123456789abcdef") != "" {
		t.Fatalf("Key = %q, want 64 lower-case hex digits", got)
	}
	if got != want {
		t.Errorf("Key = %s, want %s", got, want)
	}
	// Moving the boundaries between the parts must change the key, whatever
	// order the parts are hashed in: split "abcdef" into three parts every
	// way, and give the parts to the three arguments in every order.
	for _, order := range [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
		seen := map[string][3]string{}
		for i := 1; i < 5; i++ {
			for j := i + 1; j < 6; j++ {
				split := [3]string{"abcdef"[:i], "abcdef"[i:j], "abcdef"[j:]}
				args := [3]string{split[order[0]], split[order[1]], split[order[2]]}
				k := Key(args[0], args[1], args[2])
				if prev, dup := seen[k]; dup {
					t.Errorf("Key%q == Key%q", args, prev)
				}
				seen[k] = args
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for attempt, cap := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 50: time.Second} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.delay(attempt)
			if d < cap/2 || d > cap {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", attempt, d, cap/2, cap)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("attempt %d: only %d distinct delays in 200: no jitter", attempt, len(seen))
		}
	}
}

func TestErrorText(t *testing.T) {
	if got := errorText(errors.New("bad \xff byte\x00here")); got != "bad \uFFFD byte\uFFFDhere" {
		t.Errorf("errorText = %q", got)
	}
	long := errorText(errors.New(strings.Repeat("é", 2000)))
	if len(long) > maxErrorBytes+len("…") || !strings.HasSuffix(long, "…") || !strings.HasPrefix(long, "éé") {
		t.Errorf("long error text is %d bytes", len(long))
	}
	if !strings.HasSuffix(strings.TrimSuffix(long, "…"), "é") {
		t.Error("long error text cut inside a character")
	}
}

func TestPermanent(t *testing.T) {
	cause := errors.New("card declined")
	err := Permanent(cause)
	if !errors.Is(err, ErrPermanent) || !errors.Is(err, cause) || !strings.Contains(err.Error(), "card declined") {
		t.Errorf("Permanent(cause) = %v", err)
	}
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
	if errors.Is(cause, ErrPermanent) {
		t.Error("a plain error matches ErrPermanent")
	}
}

func TestCounts(t *testing.T) {
	var c Counts
	for _, e := range []EventType{EventSent, EventSent, EventDead, EventType(99), EventType(0)} {
		c.Observe(context.Background(), Event{Type: e})
	}
	if c.Count(EventSent) != 2 || c.Count(EventDead) != 1 || c.Count(EventFailed) != 0 || c.Count(EventType(99)) != 0 {
		t.Errorf("counts: sent %d dead %d failed %d", c.Count(EventSent), c.Count(EventDead), c.Count(EventFailed))
	}
	c.Observe(context.Background(), Event{Type: EventListenUnavailable})
	if c.Count(EventListenUnavailable) != 1 {
		t.Errorf("counts: listen_unavailable %d, want 1", c.Count(EventListenUnavailable))
	}
	for e := EventEnqueued; e <= EventListenUnavailable; e++ {
		if strings.HasPrefix(e.String(), "EventType(") {
			t.Errorf("%d has no name", int(e))
		}
	}
}

// TestCleanupBatches checks the sequencing of Cleanup: one DELETE per batch
// until a batch comes back short.
func TestCleanupBatches(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, err := New(db, "shop", WithCleanupBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	day := int64(24 * time.Hour / time.Millisecond)
	for _, n := range []int64{3, 3, 1} {
		mock.ExpectExec(ob.q.cleanup).WithArgs(day, 3).WillReturnResult(sqlmock.NewResult(0, n))
	}
	n, err := ob.Cleanup(context.Background(), 24*time.Hour)
	if err != nil || n != 7 {
		t.Errorf("Cleanup = %d, %v; want 7", n, err)
	}
	// A failing batch stops the cleanup and reports what was deleted.
	boom := errors.New("connection reset")
	mock.ExpectExec(ob.q.cleanup).WithArgs(day, 3).WillReturnResult(sqlmock.NewResult(0, 3))
	mock.ExpectExec(ob.q.cleanup).WithArgs(day, 3).WillReturnError(boom)
	n, err = ob.Cleanup(context.Background(), 24*time.Hour)
	if !errors.Is(err, boom) || n != 3 {
		t.Errorf("Cleanup = %d, %v; want 3 and the error", n, err)
	}
	// A sub-millisecond retention rounds up, never down to "everything".
	mock.ExpectExec(ob.q.cleanup).WithArgs(int64(1), 3).WillReturnResult(sqlmock.NewResult(0, 0))
	if _, err := ob.Cleanup(context.Background(), time.Microsecond); err != nil {
		t.Error(err)
	}
	if _, err := ob.Cleanup(context.Background(), -time.Hour); err == nil {
		t.Error("Cleanup with a negative retention succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ob.Cleanup(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Cleanup with a cancelled context: %v", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestEnqueueStatements checks which statement Enqueue runs, with which
// parameters, with and without notification.
func TestEnqueueStatements(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var c Counts
	notifying, err := New(db, "shop", WithObserver(&c))
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := New(db, "shop", WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	key := Key("shop", "order-1", "mail")
	mock.ExpectBegin()
	mock.ExpectQuery(notifying.q.enqueueNotify).WithArgs("shop", "order-1", "mail", key, `{"a":1}`, nil, nil, nil, nil, nil, nil, nil, notifying.Channel()).
		WillReturnRows(sqlmock.NewRows([]string{"id", "pg_notify"}).AddRow(7, ""))
	at := time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.FixedZone("CET", 3600))
	mock.ExpectQuery(quiet.q.enqueue).WithArgs("shop", "order-1", "mail", "given-key", `{"a":1}`,
		time.Date(2026, 12, 1, 8, 30, 0, 123456000, time.UTC), int64(789), nil, nil, nil, "account:1", int64(4)).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(8))
	mock.ExpectQuery(quiet.q.enqueue).WithArgs("shop", "order-1", "mail", "given-key", `{"a":1}`, nil, nil, nil, nil, nil, nil, nil).
		WillReturnRows(sqlmock.NewRows([]string{"id"}))
	mock.ExpectCommit()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if k, err := notifying.Enqueue(ctx, tx, "order-1", "mail", []byte(`{"a":1}`)); err != nil || k != key {
		t.Errorf("Enqueue = %q, %v", k, err)
	}
	if k, err := quiet.Enqueue(ctx, tx, "order-1", "mail", []byte(`{"a":1}`), WithKey("given-key"), WithEventTime(at), WithOrder("account:1", 4)); err != nil || k != "given-key" {
		t.Errorf("Enqueue WithKey = %q, %v", k, err)
	}
	if _, err := quiet.Enqueue(ctx, tx, "order-1", "mail", []byte(`{"a":1}`), WithKey("given-key")); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("Enqueue of an existing key: %v, want ErrDuplicateKey", err)
	}
	if _, err := quiet.Enqueue(ctx, tx, "order-1", "mail", []byte(`{"a":1}`), nil); err == nil {
		t.Error("Enqueue with a nil option succeeded")
	}
	if _, err := quiet.Enqueue(ctx, tx, "order-1", "mail", []byte(`{"a":1}`), WithEventTime(time.Time{})); err == nil || !strings.Contains(err.Error(), "zero time") {
		t.Errorf("Enqueue WithEventTime(zero) = %v, want an error naming the zero time", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if c.Count(EventEnqueued) != 1 {
		t.Errorf("%d enqueued events, want 1", c.Count(EventEnqueued))
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestEventTimeStoredWithoutLoss: an event time goes into the row as its
// microsecond, exact (a timestamptz keeps it as it is), and the nanoseconds
// below it; read back, they are the same instant. The microsecond part
// never falls on another day than the event time, so a reader that knows
// only event_time (a relay from before event_time_ns) has the event's day.
func TestEventTimeStoredWithoutLoss(t *testing.T) {
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, at := range []time.Time{
		day.Add(24*time.Hour - 400*time.Nanosecond), // rounds to the next day's midnight in a timestamptz
		day.Add(24*time.Hour - time.Nanosecond),     // Go's end-of-day idiom
		day,
		day.Add(-500 * time.Nanosecond),
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC), // before the Unix epoch
		time.Date(2026, 12, 1, 0, 59, 59, 999999999, time.FixedZone("CET", 3600)),
		time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.UTC),
	} {
		c := enqueueConfig{at: at}
		a, n := c.eventTime()
		stored, ns := a.(time.Time), n.(int16)
		if stored.Nanosecond()%1000 != 0 || ns < 0 || ns > 999 {
			t.Errorf("%s: stored %s and %d ns, want a whole microsecond and 0 to 999", at.Format(time.RFC3339Nano), stored.Format(time.RFC3339Nano), ns)
		}
		if stored.UTC().Format(time.DateOnly) != at.UTC().Format(time.DateOnly) {
			t.Errorf("%s: stored %s, on another day", at.Format(time.RFC3339Nano), stored.Format(time.RFC3339Nano))
		}
		back := eventTimeOf(sql.NullTime{Time: stored, Valid: true}, sql.NullInt16{Int16: ns, Valid: true})
		if !back.Equal(at) {
			t.Errorf("%s: read back as %s", at.Format(time.RFC3339Nano), back.Format(time.RFC3339Nano))
		}
	}
	if a, n := (&enqueueConfig{}).eventTime(); a != nil || n != nil {
		t.Errorf("no event time: %v, %v; want NULLs", a, n)
	}
	if got := eventTimeOf(sql.NullTime{}, sql.NullInt16{}); !got.IsZero() {
		t.Errorf("a NULL event time reads as %v, want the zero time", got)
	}
	old := time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC)
	if got := eventTimeOf(sql.NullTime{Time: old, Valid: true}, sql.NullInt16{}); !got.Equal(old) {
		t.Errorf("a row without event_time_ns reads as %v, want its event_time %v", got, old)
	}
}

func TestStableEventTime(t *testing.T) {
	created := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := created.Add(-time.Hour)
	if got := (Message{CreatedAt: created, EventTime: at}).StableEventTime(); !got.Equal(at) {
		t.Errorf("with an event time: %v, want %v", got, at)
	}
	if got := (Message{CreatedAt: created}).StableEventTime(); !got.Equal(created) {
		t.Errorf("without one: %v, want the row's CreatedAt %v", got, created)
	}
}
