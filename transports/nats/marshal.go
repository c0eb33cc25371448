package nats

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsMsg is msg as a NATS message on subject: the UUID as Nats-Msg-Id (so
// a retry inside the stream's duplicate window is stored once), the
// metadata as headers, the payload as data.
func natsMsg(subject string, msg *message.Message) (*natsgo.Msg, error) {
	if msg.UUID == "" {
		return nil, fmt.Errorf("message has no UUID (it becomes the Nats-Msg-Id header)")
	}
	m := &natsgo.Msg{Subject: subject, Data: msg.Payload, Header: make(natsgo.Header, len(msg.Metadata)+1)}
	for k, v := range msg.Metadata {
		if err := checkHeader(k, v); err != nil {
			return nil, fmt.Errorf("message %s: %w", msg.UUID, err)
		}
		m.Header[k] = []string{v}
	}
	m.Header[jetstream.MsgIDHeader] = []string{msg.UUID}
	return m, nil
}

// checkHeader refuses metadata that cannot travel as a NATS header, and
// the Nats- headers the server and client set themselves.
func checkHeader(k, v string) error {
	switch {
	case k == "":
		return fmt.Errorf("metadata has an empty key")
	case len(k) >= 5 && strings.EqualFold(k[:5], "Nats-"):
		return fmt.Errorf("metadata key %q: Nats- headers are set by NATS itself", k)
	case strings.ContainsAny(k, ": \t\r\n"):
		return fmt.Errorf("metadata key %q has a colon, a space or a line break, which a NATS header key cannot", k)
	case strings.ContainsAny(v, "\r\n"):
		return fmt.Errorf("metadata %q: its value has a line break, which a NATS header value cannot", k)
	}
	return nil
}

// decode turns a stored message back into a message: it needs a
// Nats-Msg-Id, and a header with several values is not ours.
func decode(m jetstream.Msg) (*message.Message, error) {
	h := m.Headers()
	id := h.Get(jetstream.MsgIDHeader)
	if id == "" {
		return nil, fmt.Errorf("no %s header", jetstream.MsgIDHeader)
	}
	msg := message.NewMessage(id, m.Data())
	for k, vs := range h {
		if len(k) >= 5 && strings.EqualFold(k[:5], "Nats-") {
			continue
		}
		if len(vs) != 1 {
			return nil, fmt.Errorf("header %q has %d values, not one", k, len(vs))
		}
		msg.Metadata.Set(k, vs[0])
	}
	return msg, nil
}
