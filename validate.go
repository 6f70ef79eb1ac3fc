package idempotent

import (
	"fmt"
	"unicode/utf8"
)

// MaxConsumerBytes is the longest consumer name accepted by New.
const MaxConsumerBytes = 128

// validateKey returns an error wrapping ErrInvalidKey unless key can be
// claimed: non-empty, valid UTF-8, no NUL byte, at most max bytes.
func validateKey(key string, max int) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > max:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), max)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidKey, key)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: %q has a NUL byte at %d", ErrInvalidKey, key, i)
		}
	}
	return nil
}

// validateConsumer checks a consumer name: 1 to MaxConsumerBytes bytes of
// ASCII letters, digits and . _ - : /, starting with a letter or digit.
func validateConsumer(c string) error {
	if c == "" {
		return fmt.Errorf("%w: empty", ErrInvalidConsumer)
	}
	if len(c) > MaxConsumerBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidConsumer, len(c), MaxConsumerBytes)
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		alnum := (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
		punct := ch == '.' || ch == '_' || ch == '-' || ch == ':' || ch == '/'
		if !alnum && !(punct && i > 0) {
			return fmt.Errorf("%w %q: %q at byte %d (want ASCII letters, digits and . _ - : /, starting with a letter or digit)", ErrInvalidConsumer, c, rune(ch), i)
		}
	}
	return nil
}
