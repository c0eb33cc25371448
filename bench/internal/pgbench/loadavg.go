package pgbench

import (
	"os"
	"strings"
)

// LoadAvg describes the machine's load averages for the benchmark log, since
// load from other work bears on every figure: "load average" followed by the
// first n of the 1-, 5- and 15-minute averages in /proc/loadavg (Linux), or
// "load average unknown" where it cannot read them.
func LoadAvg(n int) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < n {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:n], " ")
}
