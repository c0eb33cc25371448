package bus

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
)

// The OMNIBUS_* variables that are not configuration keys. A variable with
// one of these prefixes belongs to omnibus's own tests and benchmarks; names
// a program declares with ReserveEnv (the CLI's OMNIBUS_CONFIG) are its own.
var (
	reservedEnvPrefixes = []string{"OMNIBUS_TEST_", "OMNIBUS_SOAK_", "OMNIBUS_BENCH_"}
	reservedEnvMu       sync.Mutex
	reservedEnv         = map[string]bool{}
)

// ReserveEnv declares OMNIBUS_* environment variables that a program reads
// itself and that set no configuration key (the omnibus CLI reserves
// OMNIBUS_CONFIG and its console's credentials), so CheckEnv accepts them.
func ReserveEnv(names ...string) {
	reservedEnvMu.Lock()
	defer reservedEnvMu.Unlock()
	for _, n := range names {
		reservedEnv[n] = true
	}
}

func isReservedEnv(name string) bool {
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	reservedEnvMu.Lock()
	defer reservedEnvMu.Unlock()
	return reservedEnv[name]
}

// CheckEnv holds the environment to the rule the YAML file is held to: an
// unknown key is an error, not something to ignore. It returns a
// *ConfigError for every OMNIBUS_* variable in environ ("NAME=value" entries,
// as os.Environ returns them) that sets no configuration key of this program
// (keys of transports it does not link included) and is not reserved
// (ReserveEnv), naming the variable and the nearest valid name. Values are
// never shown. LoadConfig calls it.
func CheckEnv(environ []string) error {
	var known []string
	walkConfig(Config{}.doc(), "", func(key string, _ reflect.StructField, _ reflect.Value) {
		known = append(known, EnvName(key))
	})
	sort.Strings(known)
	isKnown := make(map[string]bool, len(known))
	for _, k := range known {
		isKnown[k] = true
	}
	var errs []error
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || isKnown[name] || isReservedEnv(name) || seen[name] {
			continue
		}
		seen[name] = true
		reason := fmt.Sprintf("environment variable %s sets no configuration key", name)
		if near := nearest(name, known); near != "" {
			reason += fmt.Sprintf(" (did you mean %s?)", near)
		}
		errs = append(errs, &ConfigError{Reason: reason})
	}
	return errors.Join(errs...)
}

// nearest returns the name of names closest to s in edit distance, or ""
// when none is within a third of s's length.
func nearest(s string, names []string) string {
	best, bestD := "", len(s)/3+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
