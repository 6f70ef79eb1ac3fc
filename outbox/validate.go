package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/txclaim/idempotent/dialect"
)

const (
	// MaxNameBytes is the longest consumer name or kind accepted.
	MaxNameBytes = 128
	// MaxMessageKeyBytes is the longest message key accepted, the same limit
	// as the Postgres claim table's.
	MaxMessageKeyBytes = 1024
	// MaxIdempotencyKeyBytes is the longest idempotency key accepted by
	// WithKey: 255 bytes, the limit of common providers' Idempotency-Key
	// headers.
	MaxIdempotencyKeyBytes = 255
	// MaxOrderKeyBytes is the longest ordering key WithOrder accepts, the
	// limit of every dialect's ordering tables
	// (dialect.Orderer.MaxOrderKeyBytes).
	MaxOrderKeyBytes = 512
	// maxErrorBytes bounds the error text stored in last_error.
	maxErrorBytes = 2000
)

// checkName checks a consumer name or kind: 1 to MaxNameBytes bytes of ASCII
// letters, digits and . _ - : /, starting with a letter or digit.
func checkName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(s) > MaxNameBytes {
		return fmt.Errorf("%s is %d bytes, the limit is %d", what, len(s), MaxNameBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		punct := c == '.' || c == '_' || c == '-' || c == ':' || c == '/'
		if !alnum && !(punct && i > 0) {
			return fmt.Errorf("%s %q has %q at byte %d (want ASCII letters, digits and . _ - : /, starting with a letter or digit)", what, s, rune(c), i)
		}
	}
	return nil
}

// CheckKind returns an error matching ErrInvalidKind, naming the problem,
// unless Enqueue accepts kind: 1 to MaxNameBytes ASCII letters, digits and
// . _ - : /, starting with a letter or digit. An adapter that enqueues its
// dead letters under a kind given at construction checks it there.
func CheckKind(kind string) error {
	if err := checkName("kind", kind); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidKind, err)
	}
	return nil
}

// checkMessageKey accepts what the claim table accepts: 1 to
// MaxMessageKeyBytes bytes of valid UTF-8 without NUL.
func checkMessageKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: message key is empty", ErrInvalidKey)
	case len(key) > MaxMessageKeyBytes:
		return fmt.Errorf("%w: message key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxMessageKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: message key %q is not valid UTF-8", ErrInvalidKey, key)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: message key %q has a NUL byte", ErrInvalidKey, key)
	}
	return nil
}

// checkOrder accepts what a consumer created WithOrdering accepts and a
// transport header carries: an ordering key of 1 to MaxOrderKeyBytes bytes
// of valid UTF-8 without control characters, and a sequence of at least 1.
func checkOrder(key string, seq int64) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the ordering key is empty", ErrInvalidOrder)
	case len(key) > MaxOrderKeyBytes:
		return fmt.Errorf("%w: the ordering key is %d bytes, the limit is %d", ErrInvalidOrder, len(key), MaxOrderKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: ordering key %q is not valid UTF-8", ErrInvalidOrder, key)
	case seq < 1:
		return fmt.Errorf("%w: ordering key %q: sequence %d is below 1 (sequences start at 1)", ErrInvalidOrder, key, seq)
	}
	for i, r := range key {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: ordering key %q has control character %U at byte %d (it travels in a transport header)", ErrInvalidOrder, key, r, i)
		}
	}
	return nil
}

// checkIdempotencyKey accepts 1 to MaxIdempotencyKeyBytes bytes of visible
// ASCII (0x21 to 0x7E): safe in an HTTP header and in any provider's key.
func checkIdempotencyKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: idempotency key is empty", ErrInvalidKey)
	}
	if len(key) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: idempotency key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxIdempotencyKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: idempotency key %q has byte 0x%02x at %d (want visible ASCII, no spaces)", ErrInvalidKey, key, c, i)
		}
	}
	return nil
}

// checkPayload accepts a non-empty, valid JSON document in valid UTF-8 (the
// database would reject invalid UTF-8, aborting the caller's transaction).
func checkPayload(p []byte) error {
	switch {
	case p == nil:
		return fmt.Errorf("%w: nil", ErrInvalidPayload)
	case len(p) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidPayload)
	case !utf8.Valid(p):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidPayload)
	case !json.Valid(p):
		return fmt.Errorf("%w: not valid JSON: %.40q", ErrInvalidPayload, p)
	}
	return nil
}

// errorText makes err storable as text: valid UTF-8, no NUL, at most
// maxErrorBytes bytes.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= maxErrorBytes {
		return s
	}
	cut := maxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// CheckDialect returns an error naming d unless the outbox's table can live
// in d's database: the outbox is Postgres only. An adapter that writes its
// dead letters through an Outbox in the claim's transaction checks the
// Middleware's dialect at construction, so a MySQL or SQLite consumer is
// refused there instead of failing every dead letter it writes.
func CheckDialect(d dialect.Dialect) error {
	if d == nil || d.Name() != "postgres" {
		name := "nil"
		if d != nil {
			name = d.Name()
		}
		return fmt.Errorf("the outbox is Postgres only, and the claim's transaction is on the %s dialect's database", name)
	}
	return nil
}
