package pgbench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU is a reading of the CPU time spent so far by this process and by the
// whole machine (every process, the database server's included), so a phase
// of a benchmark can say what it cost per event and who paid: on a machine
// of two cores a relay and the server share them, and the relay's wall time
// follows their sum.
type CPU struct {
	self    time.Duration
	machine time.Duration
	ok      bool
}

// ReadCPU reads this process's user and system time (getrusage) and the
// machine's busy time (/proc/stat; Linux).
func ReadCPU() CPU {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return CPU{}
	}
	self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPU{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return CPU{}
	}
	// user nice system idle iowait irq softirq steal guest guest_nice: the
	// busy ones are user, nice, system, irq and softirq (steal is time the
	// hypervisor gave to others; guest time is counted in user already).
	var busy int64
	for i, v := range f[1:min(len(f), 8)] {
		if i == 3 || i == 4 || i == 7 { // idle, iowait, steal
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return CPU{}
		}
		busy += n
	}
	// USER_HZ is 100 on every Linux this runs on.
	return CPU{self: self, machine: time.Duration(busy) * 10 * time.Millisecond, ok: true}
}

// PerEvent describes the CPU spent from c to now per event, in
// microseconds: "CPU per event: N µs on the machine, of which M µs in this
// process", or "CPU per event unknown".
func (c CPU) PerEvent(events int) string {
	now := ReadCPU()
	if !c.ok || !now.ok || events <= 0 {
		return "CPU per event unknown"
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(events) }
	return fmt.Sprintf("CPU per event: %.1f µs on the machine, of which %.1f µs in this process",
		us(now.machine-c.machine), us(now.self-c.self))
}
