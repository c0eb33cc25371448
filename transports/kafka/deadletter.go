package kafka

import (
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/omnibus-go/omnibus/bus"
)

// Headers added to a dead letter. The record keeps its key, value and
// headers; these say why and where it came from.
const (
	// HeaderDeadLetterReason is DeadLetterReasonGaveUp or DeadLetterReasonUndecodable.
	HeaderDeadLetterReason = bus.KeyDeadLetterReason
	// HeaderDeadLetterError is the error text (at most MaxDeadLetterErrorBytes).
	HeaderDeadLetterError = bus.KeyDeadLetterError
	// HeaderDeadLetterClass is the failure class: counted, transient or permanent.
	HeaderDeadLetterClass = bus.KeyDeadLetterClass
	// HeaderDeadLetterAttempts is the number of counted attempts spent,
	// including the last failure when it was counted.
	HeaderDeadLetterAttempts = bus.KeyDeadLetterAttempts
	// HeaderDeadLetterTopic, HeaderDeadLetterPartition and
	// HeaderDeadLetterOffset locate the original record.
	HeaderDeadLetterTopic     = bus.KeyDeadLetterTopic
	HeaderDeadLetterPartition = bus.DeadLetterPrefix + "partition"
	HeaderDeadLetterOffset    = bus.DeadLetterPrefix + "offset"
	// HeaderDeadLetterGroup is the consumer group that gave up.
	HeaderDeadLetterGroup = bus.KeyDeadLetterGroup
	// HeaderDeadLetterAt is when it was dead-lettered, RFC 3339 in UTC.
	HeaderDeadLetterAt = bus.KeyDeadLetterAt
)

// The values of HeaderDeadLetterReason.
const (
	// DeadLetterReasonGaveUp: a handler failure settled with GiveUp (the
	// budget ran out, or the failure was permanent).
	DeadLetterReasonGaveUp = bus.DeadLetterReasonGaveUp
	// DeadLetterReasonUndecodable: the Marshaler could not decode the record.
	DeadLetterReasonUndecodable = bus.DeadLetterReasonUndecodable
)

const (
	reasonGaveUp      = DeadLetterReasonGaveUp
	reasonUndecodable = DeadLetterReasonUndecodable
)

// MaxDeadLetterErrorBytes bounds the error text kept in a dead letter.
const MaxDeadLetterErrorBytes = bus.MaxDeadLetterErrorBytes

// DeadLetterTopicFor returns the dead-letter topic of topic under pattern
// (a SubscriberConfig.DeadLetterTopic value), or "" when dead letters are off.
func DeadLetterTopicFor(pattern, topic string) string {
	if pattern == "" {
		pattern = DefaultDeadLetterTopic
	}
	if pattern == NoDeadLetters {
		return ""
	}
	return strings.ReplaceAll(pattern, "{topic}", topic)
}

// deadLetterRecord copies rec for the dead-letter topic, with the reason
// headers replacing any an earlier dead-lettering left.
func deadLetterRecord(rec *sarama.ConsumerMessage, dlq, group, reason, errText string, attempts int, class bus.Class) *sarama.ProducerMessage {
	headers := make([]sarama.RecordHeader, 0, len(rec.Headers)+9)
	for _, h := range rec.Headers {
		if h == nil || strings.HasPrefix(string(h.Key), bus.DeadLetterPrefix) {
			continue
		}
		headers = append(headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if len(errText) > MaxDeadLetterErrorBytes {
		errText = errText[:MaxDeadLetterErrorBytes]
	}
	errText = strings.ToValidUTF8(errText, "\uFFFD")
	add := func(k, v string) { headers = append(headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)}) }
	add(HeaderDeadLetterReason, reason)
	add(HeaderDeadLetterError, errText)
	add(HeaderDeadLetterClass, class.String())
	add(HeaderDeadLetterAttempts, strconv.Itoa(attempts))
	add(HeaderDeadLetterTopic, rec.Topic)
	add(HeaderDeadLetterPartition, strconv.Itoa(int(rec.Partition)))
	add(HeaderDeadLetterOffset, strconv.FormatInt(rec.Offset, 10))
	add(HeaderDeadLetterGroup, group)
	add(HeaderDeadLetterAt, time.Now().UTC().Format(time.RFC3339Nano))
	pm := &sarama.ProducerMessage{Topic: dlq, Headers: headers}
	if rec.Key != nil {
		pm.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		pm.Value = sarama.ByteEncoder(rec.Value)
	}
	return pm
}

// deadLetter publishes r to the dead-letter topic, retrying with backoff
// until it is acknowledged. It reports false when the partition was released
// first: the record stays not done and its next owner handles it again.
func (w *partitionWorker) deadLetter(r *record, reason, errText string, attempts int, class bus.Class) bool {
	log := w.log.With("offset", r.rec.Offset, "reason", reason, "attempts", attempts, "error", errText)
	dlq := w.dlTopic
	if dlq == "" {
		log.Error("kafka record given up; dead letters are off, skipping it")
		return true
	}
	backoff := 100 * time.Millisecond
	for {
		pub, err := w.sub.s.deadLetterPublisher()
		if err == nil {
			pm := deadLetterRecord(r.rec, dlq, w.cfg.ConsumerGroup, reason, errText, attempts, class)
			err = pub.send(w.ctx, dlq, []*sarama.ProducerMessage{pm})
		}
		if err == nil {
			log.Warn("kafka record dead-lettered", "dead_letter_topic", dlq)
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		// Whatever the class: skipping the record would lose it, so the
		// partition waits (a record the dead-letter topic refuses for what it
		// is, e.g. larger than its max.message.bytes, needs an operator).
		log.Error("kafka dead letter failed; retrying", "dead_letter_topic", dlq, "publish_error", err,
			"class", bus.ClassOf(err).String(), "backoff", backoff)
		if !sleepCtx(w.ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}
