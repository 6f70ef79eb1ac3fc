package adapter_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/postgres"
)

func TestEventTimeHeaderRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.FixedZone("CET", 3600))
	v := adapter.FormatEventTime(at)
	if v != "2026-12-01T08:30:00.123456789Z" {
		t.Fatalf("FormatEventTime = %q, want UTC with nanoseconds", v)
	}
	got, err := adapter.ParseEventTime(v)
	if err != nil || !got.Equal(at) {
		t.Fatalf("ParseEventTime(%q) = (%v, %v), want %v", v, got, err, at)
	}
	if got, err := adapter.ParseEventTime("  "); err != nil || !got.IsZero() {
		t.Fatalf("an empty header = (%v, %v), want no event time", got, err)
	}
	for _, bad := range []string{"1764581400", "2026-12-01", "yesterday"} {
		_, err := adapter.ParseEventTime(bad)
		if !errors.Is(err, adapter.ErrBadEventTime) || !errors.Is(err, idempotent.ErrInvalidEventTime) {
			t.Errorf("ParseEventTime(%q) = %v, want ErrBadEventTime matching ErrInvalidEventTime", bad, err)
		}
	}
}

func TestSettle(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r := adapter.Rule{
		Backoff:   idempotent.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second},
		ClockSkew: 5 * time.Minute,
		Now:       func() time.Time { return now },
	}
	msg := func(at time.Time) idempotent.Message { return idempotent.Message{Key: "k", EventTime: at} }
	wrap := func(err error) error { return fmt.Errorf("idempotent: consumer \"c\", key \"k\": %w", err) }
	for _, c := range []struct {
		name  string
		msg   idempotent.Message
		err   error
		try   int
		want  adapter.Action
		delay time.Duration
	}{
		{"applied or duplicate", msg(now), nil, 1, adapter.Ack, 0},
		{"too old", msg(now.AddDate(0, -2, 0)), wrap(idempotent.ErrBeyondRetention), 1, adapter.DeadLetter, 0},
		{"bad key", msg(now), wrap(idempotent.ErrInvalidKey), 1, adapter.DeadLetter, 0},
		{"bad ordering", msg(now), wrap(idempotent.ErrInvalidOrder), 1, adapter.DeadLetter, 0},
		{"skipped sequence", msg(now), wrap(idempotent.ErrSkippedSequence), 1, adapter.DeadLetter, 0},
		{"a handler that ends the claim's transaction", msg(now), wrap(idempotent.ErrAutocommit), 1, adapter.DeadLetter, 0},
		{"bad header", msg(time.Time{}), wrap(adapter.ErrBadEventTime), 1, adapter.DeadLetter, 0},
		{"no event time where one is required", msg(time.Time{}), wrap(idempotent.ErrInvalidEventTime), 1, adapter.DeadLetter, 0},
		{"ahead within the bound", msg(now.Add(25 * time.Minute)), wrap(idempotent.ErrInvalidEventTime), 1, adapter.Requeue, 20 * time.Minute},
		{"just ahead: at least the backoff", msg(now.Add(5*time.Minute + time.Millisecond)), wrap(idempotent.ErrInvalidEventTime), 3, adapter.Requeue, 400 * time.Millisecond},
		{"ahead beyond the bound", msg(now.Add(2 * time.Hour)), wrap(idempotent.ErrInvalidEventTime), 1, adapter.DeadLetter, 0},
		{"seconds read as milliseconds", msg(time.UnixMilli(now.Unix() * 1000 * 1000)), wrap(idempotent.ErrInvalidEventTime), 1, adapter.DeadLetter, 0},
		{"missing partition", msg(now), wrap(idempotent.ErrNoPartition), 2, adapter.Requeue, 200 * time.Millisecond},
		{"claim busy", msg(now), wrap(idempotent.ErrClaimBusy), 1, adapter.Requeue, 100 * time.Millisecond},
		{"retries exhausted", msg(now), wrap(idempotent.ErrRetriesExhausted), 9, adapter.Requeue, time.Second},
		{"a handler's own error", msg(now), errors.New("card declined"), 1, adapter.Requeue, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := r.Settle(c.msg, c.err, c.try)
			// A backoff is jittered down to half its cap; a wait for the
			// clock is exact.
			inRange := d.Delay == c.delay || (d.Delay <= c.delay && d.Delay >= c.delay/2)
			if d.Action != c.want || !inRange || !errors.Is(d.Err, c.err) {
				t.Fatalf("Settle = %v after %v (%v), want %v after %v (a backoff: half to all of it)", d.Action, d.Delay, d.Err, c.want, c.delay)
			}
		})
	}
	// On an ordered transport the bound is the clock-skew margin: a message
	// an hour ahead (a producer's clock off by a time zone) is poison
	// rather than holding those behind it for the hour; within the margin
	// it waits; a bound given still applies.
	ordered := r
	ordered.Ordered = true
	for _, c := range []struct {
		name  string
		ahead time.Duration
		bound time.Duration
		want  adapter.Action
		delay time.Duration
	}{
		{"an hour ahead", time.Hour, 0, adapter.DeadLetter, 0},
		{"just past twice the margin", 10*time.Minute + time.Second, 0, adapter.DeadLetter, 0},
		{"within the margin past the margin", 8 * time.Minute, 0, adapter.Requeue, 3 * time.Minute},
		{"an hour ahead, WithFutureBound(2h)", time.Hour, 2 * time.Hour, adapter.Requeue, 55 * time.Minute},
	} {
		t.Run("ordered: "+c.name, func(t *testing.T) {
			o := ordered
			o.FutureBound = c.bound
			err := wrap(idempotent.ErrInvalidEventTime)
			d := o.Settle(msg(now.Add(c.ahead)), err, 1)
			if d.Action != c.want || d.Delay != c.delay || !errors.Is(d.Err, idempotent.ErrInvalidEventTime) {
				t.Fatalf("Settle = %v after %v (%v), want %v after %v", d.Action, d.Delay, d.Err, c.want, c.delay)
			}
		})
	}
	// The zero Rule: the Middleware's defaults.
	d := adapter.Rule{}.Settle(msg(time.Now().Add(30*time.Minute)), idempotent.ErrInvalidEventTime, 1)
	if d.Action != adapter.Requeue || d.Delay < 24*time.Minute || d.Delay > 25*time.Minute {
		t.Fatalf("zero Rule, 30 minutes ahead: %v after %v, want requeue after about 25m", d.Action, d.Delay)
	}
	if s := fmt.Sprint(adapter.Ack, adapter.Requeue, adapter.DeadLetter, adapter.Action(0)); s != "ack requeue dead-letter none" {
		t.Fatalf("Action strings: %s", s)
	}
}

func TestCheckEventTimeSource(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	plain, err := idempotent.New(db, postgres.New(), "c")
	if err != nil {
		t.Fatal(err)
	}
	parted, err := idempotent.New(db, postgres.New(), "c", idempotent.WithDailyPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := adapter.CheckEventTimeSource(plain, "rabbitmq", false); err != nil {
		t.Fatalf("plain table without a producer time: %v", err)
	}
	if err := adapter.CheckEventTimeSource(parted, "rabbitmq", true); err != nil {
		t.Fatalf("partitioned table with a producer time: %v", err)
	}
	err = adapter.CheckEventTimeSource(parted, "rabbitmq", false)
	if !errors.Is(err, adapter.ErrNoProducerEventTime) || err.Error()[:9] != "rabbitmq:" {
		t.Fatalf("partitioned table without a producer time: %v, want ErrNoProducerEventTime naming the adapter", err)
	}
}

// TestRuleDelay: a Rule without a Backoff still delays a requeue (the
// default retry policy's backoff), so an adapter that requeues with it
// never spins; with one, its backoff.
func TestRuleDelay(t *testing.T) {
	p0 := idempotent.DefaultRetryPolicy()
	def := min(p0.InitialBackoff, p0.MaxBackoff) // the first attempt's cap, jittered down to half
	for range 100 {
		if d := (adapter.Rule{}).Delay(1); d < def/2 || d > def {
			t.Fatalf("zero Rule: Delay(1) = %v, want the default policy's first backoff: %v to %v", d, def/2, def)
		}
	}
	p := idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour, MaxBackoff: time.Hour}
	if d := (adapter.Rule{Backoff: p}).Delay(1); d < 30*time.Minute || d > time.Hour {
		t.Errorf("Rule with an hour's backoff: Delay(1) = %v", d)
	}
}

// TestRuleTakesAZeroClockSkew: the Rule of a Middleware created
// WithClockSkew(0) has no margin — not idempotent.DefaultClockSkew — so on
// an ordered transport a message dated a minute ahead is poison at once,
// and on a queue it waits that minute, not the minute less five.
func TestRuleTakesAZeroClockSkew(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	mw, err := idempotent.New(db, postgres.New(), "c", idempotent.WithClockSkew(0), idempotent.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	msg := idempotent.Message{Key: "k", EventTime: now.Add(time.Minute)}
	ahead := fmt.Errorf("%w: dated ahead", idempotent.ErrInvalidEventTime)
	for _, ordered := range []bool{true, false} {
		cfg := adapter.NewConfig(adapter.Transport[string]{Name: "t", Ordered: ordered, DefaultKey: func(s string) (string, error) { return s, nil }, Header: func(string, string) (string, bool) { return "", false }})
		if err := cfg.Check(mw); err != nil {
			t.Fatal(err)
		}
		d := cfg.Rule().Settle(msg, ahead, 1)
		switch {
		case ordered && d.Action != adapter.DeadLetter:
			t.Errorf("ordered, no margin: %+v, want dead-lettered", d)
		case !ordered && (d.Action != adapter.Requeue || d.Delay < time.Minute):
			t.Errorf("queue, no margin: %+v, want requeued for at least the minute it is ahead", d)
		}
	}
}
