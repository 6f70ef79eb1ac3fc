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
// parts are plain lower-case identifiers: a lower-case ASCII letter or
// underscore followed by lower-case letters, digits or underscores, at most
// [MaxIdentifierBytes] long. Dialects still quote them, so a name that
// happens to be a reserved word works.
//
// Upper-case letters are refused because quoting makes the name's case
// significant, and the databases disagree about what an unquoted name
// means: Postgres folds it to lower case (a table created by hand as
// Processed_X is processed_x, so a quoted "Processed_X" would be a second,
// empty table, in which every key already claimed in the first applies
// again); MySQL keeps, folds or ignores case depending on the server's
// lower_case_table_names (and so on its platform); SQLite ignores case. A
// lower-case name is the same table in all of them, quoted or not.
type Table struct {
	// Schema is the schema (Postgres) or database (MySQL) name; "" means the
	// connection's default.
	Schema string
	// Name is the table name.
	Name string
}

// ParseTable parses "table" or "schema.table". It returns an error wrapping
// ErrInvalidIdentifier, naming the offending part, for anything else,
// including a name with upper-case letters (see [Table]): the error says
// why and gives the lower-case name to use.
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
	if lower := strings.ToLower(s); lower != s {
		return Table{}, fmt.Errorf("table name %q: %w: it has upper-case letters: Postgres folds unquoted names to lower case, so a table created by hand as %s is %s (and MySQL folds them or not depending on lower_case_table_names); use %s",
			s, ErrInvalidIdentifier, s, lower, lower)
	}
	if len(parts) == 2 {
		return Table{Schema: parts[0], Name: parts[1]}, nil
	}
	return Table{Name: parts[0]}, nil
}

// CheckIdentifier returns an error wrapping ErrInvalidIdentifier unless s is
// a plain identifier: an ASCII letter or underscore followed by letters,
// digits or underscores, at most [MaxIdentifierBytes] long. Unlike a
// [Table]'s parts it may have upper-case letters: it also checks the column
// names of an [Upsert], which name columns of the caller's own tables.
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
