package kafka

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/assert"
)

func TestAckedMetadata_RoundTrip(t *testing.T) {
	t.Parallel()
	rec := func(off int64, done bool) *record {
		return &record{rec: &sarama.ConsumerMessage{Offset: off}, done: done}
	}
	// 100 is the first not done; 101, 103 and 140 are done beyond it.
	window := []*record{rec(100, false), rec(101, true), rec(102, false), rec(103, true), rec(140, true)}
	meta := encodeAcked(100, window)
	set := decodeAcked(100, meta)
	for off := int64(95); off < 150; off++ {
		want := off == 101 || off == 103 || off == 140
		assert.Equal(t, want, set.has(off), "offset %d", off)
	}
	assert.Equal(t, 3, set.len())

	assert.Empty(t, encodeAcked(100, []*record{rec(100, false), rec(101, false)}), "nothing done: no metadata")
	assert.False(t, decodeAcked(100, "someone else's metadata").has(101))
	assert.False(t, decodeAcked(100, ackedMetaPrefix+"!!!").has(101))

	far := encodeAcked(0, []*record{rec(0, false), rec(maxAckedBits+5, true)})
	assert.Empty(t, far, "acks beyond the bound are left out")
	assert.Less(t, len(encodeAcked(0, []*record{rec(0, false), rec(maxAckedBits, true)})), 4096,
		"metadata stays under the broker's default offset.metadata.max.bytes")
}
