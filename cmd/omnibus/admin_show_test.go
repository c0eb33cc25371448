package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// TestShow_Golden prints whole rows: every column, the metadata, the full
// last error and the payload as JSON, as text or escaped, whatever it holds.
func TestShow_Golden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, outbox, inbox := tablesConfig(t, "")
	ok(t, cli(t, ctx, "--config", path, "migrate"))
	pool := testenv.Postgres(t)

	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outbox})
	require.NoError(t, err)
	payloads := []string{
		`{"order":"order-1","amount":{"value":1250,"currency":"EUR"},"lines":[1,2]}`,
		"order order-2 paid\n\twith a tab, a bell \a and an escape \x1b[31m sequence",
		"\x00\x01binary\xff\xfe\x80 payload",
		"",
	}
	ev := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	for i, p := range payloads {
		msg := message.NewMessage(ev(i+1), []byte(p))
		if i < 2 {
			bus.SetPartitionKey(msg, fmt.Sprintf("order-%d", i+1))
			bus.SetEventType(msg, "order.paid")
		}
		msg.Metadata.Set(bus.KeyCorrelationID, "saga-7")
		msg.Metadata.Set("tenant", "acme\x1b]0;pwned\a")
		require.NoError(t, ob.Enqueue(ctx, pool, "orders", msg))
	}
	_, err = pool.Exec(ctx, `
		UPDATE `+outbox+` SET created_at = '2026-01-02T03:04:05Z', scheduled_at = '2026-01-02T03:04:05Z';
		UPDATE `+outbox+` SET status = 'failed', attempts = 6, scheduled_at = '2026-01-02T03:09:05.25Z',
			last_error = 'kafka: broker rejected the record:
	message too large (1048600 bytes)' WHERE event_id = '`+ev(1)+`';
		UPDATE `+outbox+` SET status = 'completed', completed_at = '2026-01-02T03:04:06Z' WHERE event_id = '`+ev(2)+`';
		UPDATE `+outbox+` SET locked_by = 'relay-1', locked_until = '2026-01-02T03:04:35Z' WHERE event_id = '`+ev(3)+`';`)
	require.NoError(t, err)

	in, err := postgres.NewInbox(postgres.InboxConfig{Table: inbox})
	require.NoError(t, err)
	msg := message.NewMessage(ev(9), []byte(`[1, 2, 3]`))
	bus.SetPartitionKey(msg, "order-9")
	for _, g := range []string{"billing", "shipping"} {
		_, err := in.StoreWith(ctx, pool, postgres.StoreOptions{Group: g, Topic: "orders"}, msg)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `UPDATE `+inbox+` SET created_at = '2026-01-02T03:04:05Z', scheduled_at = '2026-01-02T03:04:05Z'`)
	require.NoError(t, err)

	idOf := func(table, where string, args ...any) string {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM `+table+` WHERE `+where, args...).Scan(&id))
		return fmt.Sprint(id)
	}
	var transcript strings.Builder
	step := func(args ...string) {
		r := cli(t, ctx, append([]string{"--config", path}, args...)...)
		fmt.Fprintf(&transcript, "$ omnibus %s\n%s", strings.Join(args, " "), r.stdout)
		if r.code != exitOK {
			fmt.Fprintf(&transcript, "[exit %d] %s", r.code, r.stderr)
		}
	}
	for i := range payloads {
		step("outbox", "show", idOf(outbox, "event_id = $1", ev(i+1)))
	}
	billing := idOf(inbox, "consumer_group = 'billing'")
	step("inbox", "show", billing)
	step("inbox", "show", billing, "--group", "shipping")
	step("outbox", "show", "999999")
	step("outbox", "show", "x")
	out := strings.NewReplacer(outbox, "OUTBOX", inbox, "INBOX").Replace(transcript.String())
	golden(t, "show", out)
	assert.NotContains(t, out, "\x1b", "no terminal escape from the data reaches the terminal")
	assert.NotContains(t, out, "\a")
}
