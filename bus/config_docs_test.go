package bus

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigurationReference_ListsEveryKeyWithItsDefault keeps
// docs/configuration.md in step with Config: one row per key (from the yaml
// tags), with its environment variable and its default.
func TestConfigurationReference_ListsEveryKeyWithItsDefault(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `([a-z0-9_.]+)` \\| `([A-Z0-9_]+)` \\| ([^|]+) \\|")
	documented := map[string][2]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		_, dup := documented[m[1]]
		assert.False(t, dup, "key %s is documented twice", m[1])
		documented[m[1]] = [2]string{m[2], strings.TrimSpace(m[3])}
	}

	defaults := Config{}.WithDefaults()
	want := map[string]string{}
	walkConfig(defaults.doc(), "", func(key string, _ reflect.StructField, v reflect.Value) {
		want[key] = docDefault(v)
	})
	for _, key := range ConfigKeys() {
		got, ok := documented[key]
		if !assert.True(t, ok, "docs/configuration.md has no row for key %s", key) {
			continue
		}
		assert.Equal(t, EnvName(key), got[0], "environment variable of %s", key)
		assert.Equal(t, want[key], got[1], "default of %s", key)
	}
	for key := range documented {
		_, ok := want[key]
		assert.True(t, ok, "docs/configuration.md documents %s, which Config does not have", key)
	}
}

// docDefault renders a default as the reference writes it.
func docDefault(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return "`" + x.String() + "`"
	case []string:
		return "`[" + strings.Join(x, ", ") + "]`"
	case string:
		if x == "" {
			return "none"
		}
		return "`" + x + "`"
	default:
		return fmt.Sprintf("`%v`", x)
	}
}
