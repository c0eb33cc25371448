// Package rounds runs a benchmark's scenario several times per iteration and
// reports the median of each figure. One run of a scenario on a shared 2-core
// machine swings with whatever else the machine does; issue 26's targets are
// medians of three, and make bench runs one iteration (-benchtime 1x).
package rounds

import (
	"slices"
	"testing"
)

// N is how many rounds one iteration runs.
const N = 3

// Medians collects figures, one value per round for each name, and reports
// the median of each. A ratio is added per round (the two sides of one round
// ran back to back), so its median is a same-run ratio.
type Medians struct {
	names []string
	vals  map[string][]float64
}

// Add records v as one round's value of the figure name.
func (m *Medians) Add(name string, v float64) {
	if m.vals == nil {
		m.vals = map[string][]float64{}
	}
	if _, ok := m.vals[name]; !ok {
		m.names = append(m.names, name)
	}
	m.vals[name] = append(m.vals[name], v)
}

// Median returns the median of name's values (the upper one of an even
// count), 0 when there are none.
func (m *Medians) Median(name string) float64 {
	return Median(m.vals[name])
}

// Report reports the median of every figure as a metric of b, under its name,
// and logs each figure's values.
func (m *Medians) Report(b *testing.B) {
	b.Helper()
	for _, name := range m.names {
		b.ReportMetric(m.Median(name), name)
	}
	for _, name := range m.names {
		b.Logf("%s per round: %.4g", name, m.vals[name])
	}
}

// Median returns the median of xs (the upper one of an even count), 0 for
// none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}
