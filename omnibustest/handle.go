package omnibustest

import (
	"context"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Result is what became of one message Handle fed to a dispatcher.
type Result struct {
	// MessageID is the message's UUID.
	MessageID string
	// Status is the inbox row's final status: "completed" or "failed".
	Status string
	// Attempts is the row's count of failed calls: 0 for a message completed
	// at its first call, 1 for one completed after one failure, 2 for one
	// that failed twice and was given up on.
	Attempts int
	// LastError is the last failure's text; "" when none.
	LastError string
}

func (r Result) String() string {
	return fmt.Sprintf("%s %s after %d attempts %s", r.MessageID, r.Status, r.Attempts, r.LastError)
}

// Handle stores msgs in env's inbox for d's consumer group (each message's
// topic is topic), runs d until every one of them is completed or failed,
// stops it, and returns their results in the order of msgs. d must be a
// Dispatcher over env.Inbox.Table() that has not run yet; it cannot run
// again afterwards. A failing handler is retried with d's retry
// configuration, so give tests a short one. It fails the test after
// DrainTimeout.
func (env *Env) Handle(t TB, d *processors.Dispatcher, topic string, msgs ...*message.Message) []Result {
	t.Helper()
	cfg := d.Subscriber().Config()
	if cfg.Table != env.Inbox.Table() {
		t.Fatalf("omnibustest: Handle: the dispatcher reads %s, not this test's inbox %s", cfg.Table, env.Inbox.Table())
		return nil
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	if _, err := env.Inbox.StoreWith(context.Background(), env.Pool, postgres.StoreOptions{Group: cfg.ConsumerGroup, Topic: topic}, msgs...); err != nil {
		t.Fatalf("omnibustest: Handle: store the messages: %v", err)
		return nil
	}
	var results []Result
	query := `SELECT message_id, status, attempts, coalesce(last_error, '') FROM ` + quoted(env.Inbox.Table()) +
		` WHERE consumer_group = $1 AND message_id = ANY($2)`
	run(t, "Handle", d.Run, func(ctx context.Context) (bool, string, error) {
		rows, err := env.Pool.Query(ctx, query, cfg.ConsumerGroup, ids)
		if err != nil {
			return false, "", err
		}
		defer rows.Close()
		results = results[:0]
		settled := 0
		for rows.Next() {
			var r Result
			if err := rows.Scan(&r.MessageID, &r.Status, &r.Attempts, &r.LastError); err != nil {
				return false, "", err
			}
			if r.Status == "completed" || r.Status == "failed" {
				settled++
			}
			results = append(results, r)
		}
		return settled == len(ids), fmt.Sprintf("%d of %d messages settled: %s", settled, len(ids), describe(results)), rows.Err()
	})
	slices.SortFunc(results, func(a, b Result) int { return slices.Index(ids, a.MessageID) - slices.Index(ids, b.MessageID) })
	return results
}
