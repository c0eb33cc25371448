package bus

import (
	"errors"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A typo'd variable is refused as a typo'd YAML key is (issue 25): on main
// OMNIBUS_BROKR=redis was dropped and the memory broker started.
func TestCheckEnv_UnknownVariableIsAnErrorNamingItAndTheNearestKey(t *testing.T) {
	t.Parallel()
	err := CheckEnv([]string{"PATH=/bin", "OMNIBUS_BROKR=redis", "OMNIBUS_POSTGRES_URL=postgres://u:secret@h/db"})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInvalidConfig))
	assert.Contains(t, err.Error(), "OMNIBUS_BROKR")
	assert.Contains(t, err.Error(), "did you mean OMNIBUS_BROKER?")
	assert.NotContains(t, err.Error(), "redis", "values are never shown")
	assert.NotContains(t, err.Error(), "OMNIBUS_POSTGRES_URL", "a known key is not reported")
}

func TestCheckEnv_EveryKeyAndTheReservedNamesPass(t *testing.T) {
	t.Parallel()
	var environ []string
	walkConfig(Config{}.doc(), "", func(key string, _ reflect.StructField, _ reflect.Value) {
		environ = append(environ, EnvName(key)+"=x")
	})
	require.NotEmpty(t, environ)
	ReserveEnv("OMNIBUS_PROGRAM_OWN")
	environ = append(environ, "OMNIBUS_TEST_POSTGRES_URL=x", "OMNIBUS_SOAK_DURATION=1m", "OMNIBUS_BENCH_EXPLAIN=1",
		"OMNIBUS_PROGRAM_OWN=x", "NOT_OURS=1", "OMNIBUS_BROKER")
	assert.NoError(t, CheckEnv(environ))
}

func TestCheckEnv_FarOffNameGetsNoSuggestion(t *testing.T) {
	t.Parallel()
	err := CheckEnv([]string{"OMNIBUS_ZZZZZZZZZZZZZZZZZZZZ=1"})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "did you mean")
}
