package all_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	_ "github.com/omnibus-go/omnibus/transports/all"
	"github.com/omnibus-go/omnibus/transports/memory"
)

// The proof that a transport owns its config: a transport defined entirely
// in this file (outside bus, which is not changed for it) registers a
// section, is chosen by broker: test from YAML and from the environment, has
// its section validated with the field named, its secret redacted, and is
// opened with the section it was configured with.

// proofSection is the test transport's section.
type proofSection struct {
	// Endpoint is host:port. Required when broker is test.
	Endpoint string `yaml:"endpoint"`
	// Token is a secret.
	Token string `yaml:"token" secret:"true"`
	// Partitions defaults to 3.
	Partitions int `yaml:"partitions"`
	// Limits is a nested group of keys.
	Limits struct {
		Topics []string `yaml:"topics"`
	} `yaml:"limits"`
}

var proofOpened struct {
	sync.Mutex
	sections []proofSection
}

func init() {
	bus.Register(bus.Transport{
		Name:       "test",
		Key:        "test",
		NewSection: func() any { return new(proofSection) },
		Defaults: func(s any) {
			if p := s.(*proofSection); p.Partitions == 0 {
				p.Partitions = 3
			}
		},
		Validate: func(s any, selected bool) error {
			p := s.(*proofSection)
			ck := &bus.Check{}
			if selected && p.Endpoint == "" {
				ck.Fail("endpoint", "required when broker is test")
			}
			if p.Endpoint != "" {
				ck.HostPort("endpoint", p.Endpoint)
			}
			ck.NotNegative("partitions", int64(p.Partitions))
			return ck.Err()
		},
		Open: func(_ context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
			proofOpened.Lock()
			defer proofOpened.Unlock()
			proofOpened.sections = append(proofOpened.sections, *cfg.Section("test").(*proofSection))
			return memory.NewBroker(logger), nil
		},
	})
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "omnibus.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func section(cfg bus.Config) proofSection { return *cfg.Section("test").(*proofSection) }

func TestRegister_ATransportOutsideBusIsChosenFromYAML(t *testing.T) {
	t.Setenv("PROOF_TOKEN", "proof-token-s3cret")
	cfg, err := bus.LoadConfig(writeConfig(t, "broker: test\ntest:\n  endpoint: proof:7000\n  token: ${PROOF_TOKEN}\n  limits:\n    topics: [a, b]\n"))
	require.NoError(t, err)
	assert.Equal(t, "test", cfg.Broker)
	s := section(cfg)
	assert.Equal(t, "proof:7000", s.Endpoint)
	assert.Equal(t, "proof-token-s3cret", s.Token)
	assert.Equal(t, 3, s.Partitions, "the section's defaults are applied")
	assert.Equal(t, []string{"a", "b"}, s.Limits.Topics)

	assert.Contains(t, bus.ConfigKeys(), "test.limits.topics")
	assert.Equal(t, "OMNIBUS_TEST_ENDPOINT", bus.EnvName("test.endpoint"))
	printed := cfg.String()
	assert.NotContains(t, printed, "proof-token-s3cret", "the section's secret is redacted")
	assert.Contains(t, printed, "token: "+bus.Redacted)

	conn, err := bus.OpenBroker(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, "test", conn.BrokerName())
	require.NoError(t, conn.Close())
	proofOpened.Lock()
	defer proofOpened.Unlock()
	require.NotEmpty(t, proofOpened.sections, "the factory was called")
	assert.Contains(t, proofOpened.sections, s, "the factory got the parsed section")
}

func TestRegister_ATransportOutsideBusIsChosenFromTheEnvironment(t *testing.T) {
	t.Setenv("OMNIBUS_BROKER", "test")
	t.Setenv("OMNIBUS_TEST_ENDPOINT", "env-proof:7001")
	cfg, err := bus.LoadConfig("")
	require.NoError(t, err)
	assert.Equal(t, "test", cfg.Broker)
	assert.Equal(t, "env-proof:7001", section(cfg).Endpoint)

	conn, err := bus.OpenBroker(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}

func TestRegister_TheSectionsValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, field, reason string
	}{
		{"bad value", "test:\n  partitions: -1\n", "test.partitions", "must not be negative, got -1"},
		{"required when chosen", "broker: test\n", "test.endpoint", "required when broker is test"},
		{"not host:port", "test:\n  endpoint: nowhere\n", "test.endpoint", `"nowhere" is not host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bus.LoadConfig(writeConfig(t, tc.yaml))
			require.ErrorIs(t, err, bus.ErrInvalidConfig)
			var ce *bus.ConfigError
			require.True(t, errors.As(err, &ce), "want a *bus.ConfigError, got %T: %v", err, err)
			assert.Equal(t, tc.field, ce.Field)
			assert.Equal(t, "invalid config: "+tc.field+": "+tc.reason, err.Error())
		})
	}
	_, err := bus.LoadConfig(writeConfig(t, "test:\n  endpont: x:1\n"))
	assert.ErrorContains(t, err, "test.endpont (line 2): field endpont not found", "an unknown key of the section is an error")
}
