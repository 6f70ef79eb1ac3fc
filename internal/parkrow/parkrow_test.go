package parkrow

import (
	"maps"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 0, 0, 123456000, time.UTC)
	for _, h := range []map[string]string{nil, {"Idempotent-Order-Key": "a", "x": "é\x00"}} {
		for _, e := range []time.Time{{}, at} {
			n, text, err := Encode(e, h)
			if err != nil {
				t.Fatal(err)
			}
			if (h == nil) != (text == "") || e.IsZero() != (n == 0) {
				t.Errorf("Encode(%v, %v) = %d, %q", e, h, n, text)
			}
			e2, h2, err := Decode(n, text)
			if err != nil || !e2.Equal(e) || !maps.Equal(h2, h) {
				t.Errorf("Decode(Encode(%v, %v)) = %v, %v, %v", e, h, e2, h2, err)
			}
		}
	}
	if _, _, err := Decode(0, "{"); err == nil {
		t.Error("Decode of bad JSON: no error")
	}
}
