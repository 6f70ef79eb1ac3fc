module github.com/txclaim/idempotent

go 1.22

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2
	github.com/lib/pq v1.12.3
)
