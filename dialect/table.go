package dialect

import (
	"errors"
	"fmt"
	"strings"
)

// MaxIdentifierBytes is the longest identifier accepted in a table name: 63
// bytes, Postgres's limit (NAMEDATALEN-1), which also fits MySQL and SQLite.
const MaxIdentifierBytes = 63

// ErrInvalidIdentifier is returned, wrapped, for a table or schema name that
// is not a plain SQL identifier.
var ErrInvalidIdentifier = errors.New("invalid identifier")

// Table is a validated table name, optionally qualified by a schema. Its
// parts are plain identifiers: an ASCII letter or underscore followed by
// letters, digits or underscores, at most [MaxIdentifierBytes] long. Dialects
// still quote them, so a name that happens to be a reserved word works.
type Table struct {
	// Schema is the schema (Postgres) or database (MySQL) name; "" means the
	// connection's default.
	Schema string
	// Name is the table name.
	Name string
}

// ParseTable parses "table" or "schema.table". It returns an error wrapping
// ErrInvalidIdentifier, naming the offending part, for anything else.
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table name %q: %w: at most one dot (schema.table)", s, ErrInvalidIdentifier)
	}
	for _, p := range parts {
		if err := CheckIdentifier(p); err != nil {
			return Table{}, fmt.Errorf("table name %q: %w", s, err)
		}
	}
	if len(parts) == 2 {
		return Table{Schema: parts[0], Name: parts[1]}, nil
	}
	return Table{Name: parts[0]}, nil
}

// CheckIdentifier returns an error wrapping ErrInvalidIdentifier unless s is
// a plain identifier (see [Table]).
func CheckIdentifier(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrInvalidIdentifier)
	}
	if len(s) > MaxIdentifierBytes {
		return fmt.Errorf("%w: %q is %d bytes, the limit is %d", ErrInvalidIdentifier, s, len(s), MaxIdentifierBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		digit := c >= '0' && c <= '9'
		if !letter && !(digit && i > 0) {
			return fmt.Errorf("%w: %q has %q at byte %d (want letters, digits and underscores, not starting with a digit)", ErrInvalidIdentifier, s, rune(c), i)
		}
	}
	return nil
}

// String returns the table name as it was parsed, unquoted.
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Quoted returns the table name with each part quoted by quote.
func (t Table) Quoted(quote func(string) string) string {
	if t.Schema == "" {
		return quote(t.Name)
	}
	return quote(t.Schema) + "." + quote(t.Name)
}
