package bus

import (
	"fmt"
	"reflect"
)

// The tests of package bus reach the kafka and redis sections by their keys:
// bus never imports a transport, so its tests cannot name the section types.
// The transports are linked into the test binary by open_test.go (package
// bus_test imports transports/all).

// with returns c with the dotted keys set (key, value, key, value, …) as
// the OMNIBUS_* variables set them (lists comma-separated).
func with(c Config, kv ...string) Config {
	vars := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		vars[EnvName(kv[i])] = kv[i+1]
	}
	if err := c.ApplyEnv(env(vars)); err != nil {
		panic(fmt.Sprintf("with %v: %v", kv, err))
	}
	return c
}

// keyValue returns the value of the dotted key of c.
func keyValue(c Config, key string) any {
	var out any
	walkConfig(c.doc(), "", func(k string, _ reflect.StructField, v reflect.Value) {
		if k == key {
			out = v.Interface()
		}
	})
	if out == nil {
		panic("no key " + key)
	}
	return out
}
