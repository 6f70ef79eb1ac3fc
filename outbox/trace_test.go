package outbox

import (
	"context"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// fixedTracer is a Tracer whose Inject returns tc.
type fixedTracer map[string]string

func (f fixedTracer) Inject(context.Context) map[string]string { return f }

func (f fixedTracer) StartSend(ctx context.Context, m Message) (context.Context, map[string]string, func(error)) {
	return ctx, m.Trace, func(error) {}
}

// TestEnqueueStoresTheTraceContext checks the trace columns Enqueue
// writes: each value as the Tracer gave it when within its bound, none
// when past it or unprintable, and baggage cut after its last whole member
// that fits.
func TestEnqueueStoresTheTraceContext(t *testing.T) {
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	member := "k=" + strings.Repeat("v", 98) // 100 bytes
	long := strings.Repeat(member+",", 10) + member
	for _, tc := range []struct {
		name                   string
		in                     map[string]string
		parent, state, baggage any
	}{
		{"none", nil, nil, nil, nil},
		{"all", map[string]string{"traceparent": parent, "tracestate": "ro=1", "baggage": "user=7"}, parent, "ro=1", "user=7"},
		{"oversized state", map[string]string{"traceparent": parent, "tracestate": strings.Repeat("a", MaxTraceStateBytes+1)}, parent, nil, nil},
		{"unprintable parent", map[string]string{"traceparent": parent + "\x00"}, nil, nil, nil},
		{"long baggage", map[string]string{"baggage": long}, nil, nil, strings.Repeat(member+",", 9) + member},
		{"one huge baggage member", map[string]string{"baggage": strings.Repeat("x", MaxBaggageBytes+1)}, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ob, err := New(db, "shop", WithoutNotify(), WithTracer(fixedTracer(tc.in)))
			if err != nil {
				t.Fatal(err)
			}
			mock.ExpectBegin()
			mock.ExpectQuery(ob.q.enqueue).WithArgs("shop", "order-1", "mail", Key("shop", "order-1", "mail"), `{}`, nil, nil,
				tc.parent, tc.state, tc.baggage, nil, nil).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(1))
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Enqueue(context.Background(), tx, "order-1", "mail", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestWithTracerNil(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := New(db, "shop", WithTracer(nil)); err == nil || !strings.Contains(err.Error(), "nil Tracer") {
		t.Errorf("WithTracer(nil): %v, want an error naming the nil Tracer", err)
	}
}
