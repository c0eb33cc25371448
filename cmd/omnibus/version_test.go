package main

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVersionFlag_PrintsTheModuleVersionAndCommit(t *testing.T) {
	t.Parallel()
	r := cli(t, context.Background(), "--version")
	ok(t, r)
	info, _ := debug.ReadBuildInfo()
	assert.Equal(t, versionString(info)+"\n", r.stdout)
	assert.Regexp(t, `^omnibus version \S+, commit \S+`, r.stdout)
}

func TestVersionString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "omnibus version (devel), commit unknown"},
		{"built from a checkout without vcs stamping", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"omnibus version (devel), commit unknown, go1.26.0"},
		{"go install of a release", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}},
			"omnibus version v1.4.0, commit unknown, go1.26.0"},
		{"built from a modified checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: ""}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "ff95232c0ffee"}, {Key: "vcs.modified", Value: "true"},
		}}, "omnibus version (devel), commit ff95232c0ffee (modified), go1.26.0"},
		{"clean checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.1-0.20260101000000-ff95232c0ffe"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "ff95232c0ffee"}, {Key: "vcs.modified", Value: "false"},
		}}, "omnibus version v1.4.1-0.20260101000000-ff95232c0ffe, commit ff95232c0ffee, go1.26.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, versionString(tc.info))
		})
	}
}
