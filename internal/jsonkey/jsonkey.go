// Package jsonkey reads a message key from a field of a JSON object: the
// one implementation behind the broker adapters' BodyField key functions.
package jsonkey

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Field returns the value at path in data, which must hold one JSON object,
// following path through nested objects. A string is returned as it is; a
// number as written in data. what names data in errors ("body", "value").
// The error wraps undecodable when data is not one JSON value holding an
// object, and noKey when the field is missing, null, empty or of another
// type, or an object on the way is not one. path must not be empty.
func Field(data []byte, path []string, what string, undecodable, noKey error) (string, error) {
	where := strings.Join(path, ".")
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("%w: reading key field %q: %w", undecodable, where, err)
	}
	if dec.More() {
		return "", fmt.Errorf("%w: reading key field %q: data after the JSON value", undecodable, where)
	}
	for i, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			if i == 0 {
				return "", fmt.Errorf("%w: reading key field %q: the %s is a JSON %s, not an object", undecodable, where, what, kind(v))
			}
			return "", fmt.Errorf("%w: field %q is a JSON %s, not an object", noKey, strings.Join(path[:i], "."), kind(v))
		}
		if v, ok = obj[p]; !ok {
			return "", fmt.Errorf("%w: no field %q in the %s", noKey, where, what)
		}
	}
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", fmt.Errorf("%w: field %q is empty", noKey, where)
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("%w: field %q is a JSON %s, want a string or a number", noKey, where, kind(v))
}

// kind names the JSON type of a decoded value.
func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}
