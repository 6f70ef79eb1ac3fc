package adapter

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent"
)

var (
	// ErrPoison marks a delivery as poison: delivering it again would fail
	// the same way, so the adapter dead-letters (or terminates) it, exactly
	// once, with nothing written. Every adapter of this module uses this
	// one value; mark a handler's own errors with [Poison].
	ErrPoison = errors.New("adapter: poison message")

	// ErrUndecodable reports a payload that a decode function (or the JSON
	// parsing of a BodyField key function) could not decode. It matches
	// ErrPoison.
	ErrUndecodable = fmt.Errorf("%w: undecodable payload", ErrPoison)

	// ErrNoKey reports a delivery that carries no message key where its
	// key function looks: a missing or empty header or id, a missing
	// payload field. It matches idempotent.ErrInvalidKey, so the delivery
	// is poison.
	ErrNoKey = fmt.Errorf("%w: the message carries no key", idempotent.ErrInvalidKey)

	// ErrNoEventTime reports a delivery that carries no event time where
	// the adapter must find one: in partitioned mode, no EventTimeHeader;
	// with a transport time, none on the delivery; with an event-time
	// function, the zero time. It matches idempotent.ErrInvalidEventTime,
	// so the delivery is poison.
	ErrNoEventTime = fmt.Errorf("%w: the message carries no event time", idempotent.ErrInvalidEventTime)
)

// Poison marks err as poison: it returns an error matching both ErrPoison
// and err. A nil err stays nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrPoison) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// IsPoison reports whether err is marked poison: it matches ErrPoison
// (see [Poison]; ErrUndecodable does). Rule.Settle poisons these and the
// Middleware's errors that no redelivery can fix.
func IsPoison(err error) bool { return errors.Is(err, ErrPoison) }

// ItemError reports what is wrong with one message of a batch given to a
// batch handler: Index is its position in the slice the handler was given.
// A batch handler returns one (through [PoisonItem]) to dead-letter that
// message alone: the adapter runs the batch again without it.
type ItemError struct {
	// Index is the message's position in the batch handler's slice.
	Index int
	// Err is what is wrong with it.
	Err error
}

// Error names the message's index and the error.
func (e *ItemError) Error() string {
	return fmt.Sprintf("adapter: message %d of the batch: %v", e.Index, e.Err)
}

// Unwrap returns Err.
func (e *ItemError) Unwrap() error { return e.Err }

// PoisonItem returns an *ItemError for the batch's message i whose error,
// err, is marked poison: the adapter dead-letters that message alone and
// runs the rest of the batch again without it.
func PoisonItem(i int, err error) error {
	if err == nil {
		err = errors.New("poison")
	}
	return &ItemError{Index: i, Err: Poison(err)}
}
