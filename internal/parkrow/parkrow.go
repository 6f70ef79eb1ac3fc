// Package parkrow converts a parked message's event time and headers to
// and from the parking table's columns (dialect.Orderer), for the
// database/sql Middleware and idempgx alike.
package parkrow

import (
	"encoding/json"
	"fmt"
	"time"
)

// Encode returns the event_time_us and headers columns of a parked
// message: microseconds since the epoch, 0 for no event time, and the
// headers as JSON, "" for none.
func Encode(eventTime time.Time, headers map[string]string) (at int64, text string, err error) {
	if !eventTime.IsZero() {
		at = eventTime.UnixMicro()
	}
	if len(headers) > 0 {
		b, err := json.Marshal(headers)
		if err != nil {
			return 0, "", fmt.Errorf("park: headers: %w", err)
		}
		text = string(b)
	}
	return at, text, nil
}

// Decode is Encode's inverse: the zero time for 0, nil headers for "".
func Decode(at int64, text string) (eventTime time.Time, headers map[string]string, err error) {
	if at != 0 {
		eventTime = time.UnixMicro(at).UTC()
	}
	if text != "" {
		if err := json.Unmarshal([]byte(text), &headers); err != nil {
			return eventTime, nil, fmt.Errorf("parked headers: %w", err)
		}
	}
	return eventTime, headers, nil
}
