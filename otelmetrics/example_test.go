package otelmetrics_test

import (
	"database/sql"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/otelmetrics"
	"github.com/txclaim/idempotent/postgres"
)

// Wire the observer into a middleware. In a service, pass the global or the
// application's MeterProvider instead of a fresh one.
func ExampleNew() {
	provider := sdkmetric.NewMeterProvider()
	obs, err := otelmetrics.New(provider)
	if err != nil {
		panic(err)
	}
	// sql.Open connects lazily; a service would open it through
	// idempotent.GuardConnector.
	db, err := sql.Open("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithObserver(obs))
	fmt.Println(mw.Config().Consumer, err)
	// Output: loyalty <nil>
}
