package postgres

import (
	"testing"
)

// A fetch hands each unit its rows in id order, as a capped slice of one
// array: appending to one unit's rows must not overwrite another's.
func TestSpread_UnitsGetTheirRowsInIDOrder(t *testing.T) {
	sc := &pickedRows{}
	// Rows of three units, interleaved and out of order, as RETURNING may
	// give them.
	for _, r := range []struct {
		id   int64
		unit int
	}{{5, 0}, {9, 1}, {3, 0}, {7, 2}, {1, 1}, {4, 0}} {
		sc.rows = append(sc.rows, row{id: r.id})
		sc.unit = append(sc.unit, r.unit)
	}
	units := make([]unit, 3)
	sc.spread(units)
	want := [][]int64{{3, 4, 5}, {1, 9}, {7}}
	for i, u := range units {
		var got []int64
		for _, r := range u.rows {
			got = append(got, r.id)
		}
		if len(got) != len(want[i]) {
			t.Fatalf("unit %d: rows %v, want %v", i, got, want[i])
		}
		for j := range got {
			if got[j] != want[i][j] {
				t.Fatalf("unit %d: rows %v, want %v", i, got, want[i])
			}
		}
		if cap(u.rows) != len(u.rows) {
			t.Errorf("unit %d: cap %d, len %d: an append would write into the next unit's rows", i, cap(u.rows), len(u.rows))
		}
	}
	units[0].rows = append(units[0].rows, row{id: 100})
	if units[1].rows[0].id != 1 {
		t.Fatalf("appending to unit 0 changed unit 1's first row to %d", units[1].rows[0].id)
	}
	sc.release()
}

// internedText gives nil for NULL, the empty string for an empty text, and
// one shared string while the text repeats.
func TestInternedText(t *testing.T) {
	var it internedText
	if p := it.of(nil); p != nil {
		t.Fatalf("NULL: got %q, want nil", *p)
	}
	empty := it.of([]byte{})
	if empty == nil || *empty != "" {
		t.Fatalf("empty text: got %v, want a pointer to \"\"", empty)
	}
	buf := []byte("key-1")
	a := it.of(buf)
	copy(buf, "key-2") // the driver reuses its buffer for the next row
	if *a != "key-1" {
		t.Fatalf("the string changed with the driver's buffer: %q", *a)
	}
	b := it.of(buf)
	if *b != "key-2" || a == b {
		t.Fatalf("a different text: got %q (shared %v), want key-2 in a string of its own", *b, a == b)
	}
	if c := it.of([]byte("key-2")); c != b {
		t.Fatalf("a repeated text was not shared")
	}
	if p := it.of(nil); p != nil {
		t.Fatalf("NULL after a text: got %q, want nil", *p)
	}
}
