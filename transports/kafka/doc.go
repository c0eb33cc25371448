// Package kafka is the Kafka transport of omnibus, built on sarama: a
// Watermill Publisher and a consumer-group Subscriber. Importing it
// registers the kafka broker with bus, with its config section (Config, the
// kafka: keys and OMNIBUS_KAFKA_* variables; Section reads it from a
// bus.Config).
//
// The Publisher feeds one shared, idempotent AsyncProducer (acks from every
// in-sync replica by default). Concurrent Publish calls are batched together;
// each returns once its own messages are acknowledged. The partition key
// (bus.KeyPartitionKey) is the record key, so the records of one key land on
// one partition in order. Broker and network failures come back as
// bus.Transient errors, so an outbox relay spends no attempts while Kafka is
// down; a batch the broker rejects for what it carries is a counted error,
// so a record it keeps rejecting reaches its attempt budget instead of
// holding its key back forever (see Publisher for the classes).
//
// The Subscriber delivers records of different keys of a partition
// concurrently (up to MaxInFlight) and the records of one key one at a time,
// in order. It commits an offset only when every earlier offset of the
// partition is acked, redelivers nacked records in place after the
// settlement's retry time, and publishes records that are given up on, or
// cannot be decoded, to a dead-letter topic with the reason in their
// headers. Each message's context carries a bus.Delivery. It reads ahead of
// its handlers up to MaxReadAheadBytes per partition, then pauses fetching
// that partition until half of it is done.
//
//	conn := kafka.ConnectionConfig{Brokers: []string{"localhost:9092"}}
//	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: conn}, logger)
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//
//	msg := message.NewMessage(watermill.NewUUID(), payload)
//	bus.SetPartitionKey(msg, "order-42")
//	if err := pub.Publish("orders", msg); err != nil {
//		return err // bus.ClassOf(err) == bus.ClassTransient while brokers are down
//	}
//
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		ConnectionConfig: conn, // brokers, TLS, SASL: shared with the publisher
//		ConsumerGroup:    "billing",
//		MaxInFlight:      32, // per partition; 1 keeps strict partition order
//	}, logger)
//	if err != nil {
//		return err
//	}
//	defer sub.Close()
//	router.AddNoPublisherHandler("billing", "orders", sub, handle)
package kafka
