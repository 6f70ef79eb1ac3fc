package main

import "testing"

func TestSpliceSections(t *testing.T) {
	doc := "# Benchmarks\n\nintro\n\n## A\n\nold a\n\n## B\n\nold b\nnotes\n\n## C\n\nold c\n"
	out := "## B\n\nnew b\n\n\n## D\n\nnew d\n"
	want := "# Benchmarks\n\nintro\n\n## A\n\nold a\n\n## B\n\nnew b\n\n## C\n\nold c\n\n## D\n\nnew d\n"
	if got := spliceSections(doc, out); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	last := "## C\n\nnewer c\n"
	if got, want := spliceSections(want, last), "# Benchmarks\n\nintro\n\n## A\n\nold a\n\n## B\n\nnew b\n\n## C\n\nnewer c\n\n## D\n\nnew d\n"; got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}
