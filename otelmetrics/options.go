package otelmetrics

import (
	"errors"

	"go.opentelemetry.io/otel/trace"
)

// An Option configures an Observer. Options are checked by New: a bad value
// is an error from New.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	tp trace.TracerProvider
}

// WithTracerProvider makes the Observer record one span per delivery with a
// tracer of tp (see the package documentation). Pass
// otel.GetTracerProvider() for the global one. Default is no spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		if tp == nil {
			return errors.New("otelmetrics: WithTracerProvider: nil TracerProvider")
		}
		c.tp = tp
		return nil
	})
}
