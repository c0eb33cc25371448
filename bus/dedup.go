package bus

import "context"

// PublishDeduplicator is implemented by brokers that store a message
// published again with the same UUID once, within a window the broker keeps:
// its consumers never receive the copy, so an inbox has nothing to drop.
type PublishDeduplicator interface {
	DeduplicatesPublishes() bool
}

// DeduplicatesPublishes reports whether the broker deduplicates publishes
// (see PublishDeduplicator). It waits for the broker's connection.
func (b *Conn) DeduplicatesPublishes(ctx context.Context) (bool, error) {
	if err := b.WaitBroker(ctx); err != nil {
		return false, err
	}
	br, err := b.broker.current()
	if err != nil {
		return false, err
	}
	d, ok := br.(PublishDeduplicator)
	return ok && d.DeduplicatesPublishes(), nil
}
