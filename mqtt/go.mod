module github.com/txclaim/idempotent/mqtt

go 1.26.0

require (
	github.com/eclipse/paho.golang v0.23.0
	github.com/txclaim/idempotent v0.0.0
)

require github.com/lib/pq v1.12.3 // indirect

replace github.com/txclaim/idempotent => ../
