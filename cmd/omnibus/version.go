package main

import (
	"runtime/debug"
	"strings"
)

// versionString describes the binary from its build info: the module
// version ("(devel)" when built from a checkout rather than installed from a
// release), the commit it was built from with ", modified" when the checkout
// had local changes ("unknown" when the build did not record it, e.g.
// -buildvcs=false), and the Go version.
func versionString(info *debug.BuildInfo) string {
	version, commit := "(devel)", "unknown"
	var b strings.Builder
	b.WriteString("omnibus version ")
	if info == nil {
		b.WriteString(version + ", commit " + commit)
		return b.String()
	}
	if v := info.Main.Version; v != "" {
		version = v
	}
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	b.WriteString(version + ", commit " + commit)
	if modified {
		b.WriteString(" (modified)")
	}
	if info.GoVersion != "" {
		b.WriteString(", " + info.GoVersion)
	}
	return b.String()
}

// buildVersion is versionString of this binary.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return versionString(info)
}
