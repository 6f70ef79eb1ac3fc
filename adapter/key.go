package adapter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// A KeyFunc returns a delivery's message key: the stable identity the
// producer gave the message's effect. It must return the same key for every
// copy of the message — redelivered, re-sent by a producer retry, replayed
// from a dead-letter queue weeks later — so it must never be built from
// what the broker assigns (an offset, a sequence number, a delivery tag).
// An error (conventionally wrapping ErrNoKey) makes the delivery poison.
//
// Every adapter names its own instance (kafka.KeyFunc is
// KeyFunc[*kgo.Record]) and has the same key functions: Header, BodyField,
// Prefixed and the transport's producer-set id, the default.
type KeyFunc[T any] func(msg T) (string, error)

// HeaderKey returns a KeyFunc that reads the header name with get, which
// returns the header's value and whether the delivery has it. A missing or
// empty header fails with ErrNoKey. Adapters build their Header key
// function with it.
func HeaderKey[T any](name string, get func(msg T, name string) (string, bool)) KeyFunc[T] {
	return func(msg T) (string, error) {
		v, ok := get(msg, name)
		if !ok {
			return "", fmt.Errorf("%w: no %q header", ErrNoKey, name)
		}
		if v == "" {
			return "", fmt.Errorf("%w: header %q is empty", ErrNoKey, name)
		}
		return v, nil
	}
}

// BodyFieldKey returns a KeyFunc that reads a field of the JSON object
// payload returns, following path through nested objects (see JSONField).
// what names the payload in errors ("body", "value", "data"). It panics if
// path is empty. Adapters build their BodyField key function with it.
func BodyFieldKey[T any](what string, payload func(msg T) []byte, path ...string) KeyFunc[T] {
	if len(path) == 0 {
		panic("adapter: BodyField: empty path")
	}
	path = append([]string(nil), path...)
	return func(msg T) (string, error) {
		return jsonField(payload(msg), path, what)
	}
}

// Prefixed returns a KeyFunc that puts prefix before the key k returns, as
// in Prefixed("order-completed:", Header("order-id")). Prefixes keep the
// keys of different message types apart when one consumer reads several.
func Prefixed[T any](prefix string, k KeyFunc[T]) KeyFunc[T] {
	if k == nil {
		panic("adapter: Prefixed: nil KeyFunc")
	}
	return func(msg T) (string, error) {
		key, err := k(msg)
		if err != nil {
			return "", err
		}
		return prefix + key, nil
	}
}

// JSONField returns the value at path in data, which must hold one JSON
// object, following path through nested objects: JSONField(b, "order",
// "id") reads {"order": {"id": …}}. A string is returned as it is; a number
// as written in data. The error matches ErrUndecodable when data is not one
// JSON value holding an object, and ErrNoKey when the field is missing,
// null, empty or of another type, or an object on the way is not one.
func JSONField(data []byte, path ...string) (string, error) {
	if len(path) == 0 {
		return "", fmt.Errorf("%w: JSONField: empty path", ErrNoKey)
	}
	return jsonField(data, path, "payload")
}

func jsonField(data []byte, path []string, what string) (string, error) {
	where := strings.Join(path, ".")
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("%w: reading key field %q: %w", ErrUndecodable, where, err)
	}
	if dec.More() {
		return "", fmt.Errorf("%w: reading key field %q: data after the JSON value", ErrUndecodable, where)
	}
	for i, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			if i == 0 {
				return "", fmt.Errorf("%w: reading key field %q: the %s is a JSON %s, not an object", ErrUndecodable, where, what, jsonKind(v))
			}
			return "", fmt.Errorf("%w: field %q is a JSON %s, not an object", ErrNoKey, strings.Join(path[:i], "."), jsonKind(v))
		}
		if v, ok = obj[p]; !ok {
			return "", fmt.Errorf("%w: no field %q in the %s", ErrNoKey, where, what)
		}
	}
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", fmt.Errorf("%w: field %q is empty", ErrNoKey, where)
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("%w: field %q is a JSON %s, want a string or a number", ErrNoKey, where, jsonKind(v))
}

// jsonKind names the JSON type of a decoded value.
func jsonKind(v any) string {
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
