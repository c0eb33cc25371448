//go:build soak

package postgres

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestSoak_UniversalKeyedFullSize runs the keyed suite at its full size
// (10,000 messages through one key in several tests), which under -race on
// two cores takes too long for `make test`; `make soak` runs it. The
// semantics are those of TestUniversal_KeyedGuaranteedOrder.
func TestSoak_UniversalKeyedFullSize(t *testing.T) {
	t.Parallel()
	ob, newSub := universalTable(t)
	pool := testenv.Postgres(t)
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      false,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     true,
		Persistent:          true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return keyedPublisher{ob.Publisher(pool)}, newSub(t)
	}, nil)
}
