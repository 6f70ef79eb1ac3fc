module github.com/txclaim/idempotent/idemsqlx

go 1.22

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2
	github.com/jmoiron/sqlx v1.4.0
	github.com/lib/pq v1.12.3
	github.com/txclaim/idempotent v0.0.0
)

replace github.com/txclaim/idempotent => ../
