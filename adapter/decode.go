package adapter

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
)

// DecodeHandler returns the handler every adapter's Decode builds: it
// decodes the payload of each delivery (payload returns it) into an M with
// decode and passes it to h with the delivery. It runs inside the claim's
// transaction, so a duplicate is never decoded; a decode error is wrapped
// with ErrUndecodable (unless it is poison already), and with where's
// description of the delivery, so the delivery is dead-lettered with
// nothing written. It panics if an argument is nil.
func DecodeHandler[T, M any](payload func(msg T) []byte, where func(msg T) string, decode func(payload []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, m M, msg T) error) func(ctx context.Context, tx *sql.Tx, msg T) error {
	if payload == nil || where == nil || decode == nil || h == nil {
		panic("adapter: Decode: nil decode function or handler")
	}
	return func(ctx context.Context, tx *sql.Tx, msg T) error {
		m, err := decode(payload(msg))
		if err != nil {
			if IsPoison(err) {
				return fmt.Errorf("%s: %w", where(msg), err)
			}
			return fmt.Errorf("%s: %w: %w", where(msg), ErrUndecodable, err)
		}
		return h(ctx, tx, m, msg)
	}
}

// JSON decodes a JSON payload into an M, the decode function every
// adapter's JSON is. Fields of the payload that M does not have are
// ignored, so producers can add fields without breaking consumers; data
// after the JSON value is an error. Its errors match ErrUndecodable.
func JSON[M any](payload []byte) (M, error) {
	var m M
	if err := json.Unmarshal(payload, &m); err != nil {
		var zero M
		return zero, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	return m, nil
}
