// Package console is omnibus's admin web console: server-rendered pages
// (html/template, assets embedded with go:embed, one small script of its
// own, nothing loaded from elsewhere) over the postgres.Admin of each outbox
// and inbox table, the API the `omnibus outbox|inbox` commands use.
//
// Pages: the overview (every table and consumer group: pending, due, in
// flight, delayed, retrying, failed and completed rows, the oldest pending
// row's age, held and blocked keys, lanes, leases by instance and rows
// completed per minute over the last hour; it refreshes itself), held keys,
// failed rows (filters, paging, a row's detail) and relays (lease holders).
// Actions: requeue a row, a selection or every matching failed row, discard
// failed rows, release expired leases, sweep lanes. Each is a POST carrying
// a CSRF token, shown first as a confirmation that says what will happen
// (and, for a key blocked by the Block policy, that requeueing lifts the
// block), then as a result message. ReadOnly hides every action.
//
// The console never shows the database's address or credentials, and a
// failing query's text is logged, not shown. It reads completed rows only
// through bounded counts and the planner's estimate, so its pages do not
// slow down as completed rows pile up.
//
//	adm, _ := postgres.NewAdmin(pool, postgres.OutboxTable("omnibus_outbox"))
//	c, err := console.New(console.Config{Tables: []*postgres.Admin{adm}}, logger)
//	if err != nil { … }
//	http.ListenAndServe(console.DefaultListen, c)
package console
