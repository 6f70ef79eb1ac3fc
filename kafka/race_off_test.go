//go:build !race

package kafka_test

// raceDetector is true when the tests run with -race, which makes the
// in-process cluster several times slower: the churn test scales down.
const raceDetector = false
