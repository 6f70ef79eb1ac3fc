package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"strconv"
	"testing"
)

// TestGrowthSVG draws a chart of made-up cells and checks that it is well
// formed XML with one dot per cell, placed higher for a higher ratio.
func TestGrowthSVG(t *testing.T) {
	sizes := []int{1_000_000, 10_000_000}
	var cells []*growthCell
	for i, shape := range growthShapes {
		for _, partitioned := range []bool{false, true} {
			for j, n := range sizes {
				r := 1 - 0.1*float64(i*j) // uuid4 stays at 1.0; the others fall at 10⁷
				cells = append(cells, &growthCell{shape: shape, partitioned: partitioned, rows: n, ratios: []float64{r - 0.01, r, r + 0.01}})
			}
		}
	}
	svg := growthSVG(sizes, cells)
	d := xml.NewDecoder(bytes.NewReader(svg))
	var cys []float64
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			for _, a := range se.Attr {
				if a.Name.Local == "cy" {
					y, err := strconv.ParseFloat(a.Value, 64)
					if err != nil {
						t.Fatal(err)
					}
					cys = append(cys, y)
				}
			}
		}
	}
	if len(cys) != len(cells) {
		t.Fatalf("%d dots, want one per cell (%d)", len(cys), len(cells))
	}
	// The dots come in order plain (uuid4, uuid7, sequential), partitioned
	// (same), each at 10⁶ then 10⁷: uuid7 and sequential at 10⁷ are lower.
	for _, k := range []int{0, 6} {
		if cys[k] != cys[k+1] {
			t.Errorf("uuid4: dots at %v and %v, want the same height for the same ratio", cys[k], cys[k+1])
		}
		if !(cys[k+3] > cys[k+2] && cys[k+5] > cys[k+3]) {
			t.Errorf("dots %v: want a lower ratio drawn lower (larger y)", cys[k:k+6])
		}
	}
	if got := growthRows(10_000_000); got != "10⁷" {
		t.Errorf("growthRows(10⁷) = %q", got)
	}
}
