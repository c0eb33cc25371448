package kafka

import (
	"encoding/base64"
	"errors"
	"strings"

	"github.com/IBM/sarama"
)

// Records of a partition are acked out of offset order (different keys run
// concurrently), but a committed offset can only say "everything before me
// is done". So that a member taking a partition over does not deliver again
// what was already acked past that point, the commit metadata carries a
// bitmap of the records done after the committed offset: bit i stands for
// offset committed+1+i. It is bounded (maxAckedBits) to stay well under the
// broker's offset.metadata.max.bytes (4 KiB by default); acks beyond the
// bound are delivered again, which is safe.

const (
	ackedMetaPrefix = "omnibus.acked.v1:"
	maxAckedBits    = 16 * 1024
)

// encodeAcked returns the metadata for committing next, given the window of
// records not yet committable (window[0], if any, has offset next).
func encodeAcked(next int64, window []*record) string {
	var bits []byte
	for _, r := range window {
		if !r.done || r.rec.Offset <= next {
			continue
		}
		i := r.rec.Offset - next - 1
		if i >= maxAckedBits {
			break
		}
		for int64(len(bits)) <= i/8 {
			bits = append(bits, 0)
		}
		bits[i/8] |= 1 << (i % 8)
	}
	if len(bits) == 0 {
		return ""
	}
	return ackedMetaPrefix + base64.RawURLEncoding.EncodeToString(bits)
}

// ackedSet is the set decoded from commit metadata.
type ackedSet struct {
	base int64 // the committed offset
	bits []byte
}

func decodeAcked(committed int64, meta string) ackedSet {
	enc, ok := strings.CutPrefix(meta, ackedMetaPrefix)
	if !ok {
		return ackedSet{}
	}
	bits, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return ackedSet{}
	}
	return ackedSet{base: committed, bits: bits}
}

func (s ackedSet) has(offset int64) bool {
	i := offset - s.base - 1
	if len(s.bits) == 0 || i < 0 || i/8 >= int64(len(s.bits)) {
		return false
	}
	return s.bits[i/8]&(1<<(i%8)) != 0
}

func (s ackedSet) len() int {
	n := 0
	for _, b := range s.bits {
		for ; b != 0; b &= b - 1 {
			n++
		}
	}
	return n
}

// loadAckedBefore reads the committed offset and metadata of the partition.
// Any failure just means nothing is skipped: the records are delivered again.
func (w *partitionWorker) loadAckedBefore() ackedSet {
	committed := w.claim.InitialOffset()
	if committed < 0 {
		return ackedSet{} // nothing committed: no metadata either
	}
	client := w.sub.client
	coordinator, err := client.Coordinator(w.cfg.ConsumerGroup)
	if err != nil {
		w.log.Debug("kafka offset metadata not read", "error", err)
		return ackedSet{}
	}
	req := sarama.NewOffsetFetchRequest(client.Config().Version, w.cfg.ConsumerGroup,
		map[string][]int32{w.topic: {w.partition}})
	resp, err := coordinator.FetchOffset(req)
	if err == nil && resp != nil && !errors.Is(resp.Err, sarama.ErrNoError) {
		err = resp.Err
	}
	if err != nil {
		w.log.Debug("kafka offset metadata not read", "error", err)
		return ackedSet{}
	}
	block := resp.GetBlock(w.topic, w.partition)
	if block == nil || !errors.Is(block.Err, sarama.ErrNoError) || block.Offset != committed {
		return ackedSet{}
	}
	return decodeAcked(committed, block.Metadata)
}
