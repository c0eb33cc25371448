package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"golang.org/x/term"
)

// progress reports a long operation: a bar redrawn in place on a terminal,
// plain lines otherwise (logs, CI, pipes).
type progress struct {
	w        io.Writer
	label    string
	unit     string
	total    int64 // 0 when unknown
	terminal bool

	mu    sync.Mutex
	drawn bool
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func newProgress(w io.Writer, label, unit string, total int64) *progress {
	return &progress{w: w, label: label, unit: unit, total: total, terminal: isTerminal(w)}
}

// update reports that done units are finished so far.
func (p *progress) update(done int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal {
		fmt.Fprintf(p.w, "\r%s", p.bar(done, 30))
		p.drawn = true
		return
	}
	if p.total > 0 {
		fmt.Fprintf(p.w, "%s: %d/%d %s\n", p.label, done, p.total, p.unit)
	} else {
		fmt.Fprintf(p.w, "%s: %d %s\n", p.label, done, p.unit)
	}
}

// bar renders "label [=====>     ] 50% 500/1000 rows", or without a known
// total "label 500 rows".
func (p *progress) bar(done int64, width int) string {
	if p.total <= 0 {
		return fmt.Sprintf("%s %d %s", p.label, done, p.unit)
	}
	frac := min(float64(done)/float64(p.total), 1)
	filled := int(frac * float64(width))
	head := ""
	if filled < width {
		head = ">"
	}
	pad := width - filled - len(head)
	return fmt.Sprintf("%s [%s%s%s] %3.0f%% %d/%d %s", p.label,
		strings.Repeat("=", filled), head, strings.Repeat(" ", max(pad, 0)), frac*100, done, p.total, p.unit)
}

// finish ends the bar's line on a terminal.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal && p.drawn {
		fmt.Fprintln(p.w)
	}
}
