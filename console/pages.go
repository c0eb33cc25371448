package console

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Throughput window of the overview's sparklines.
const (
	sparkWindow = time.Hour
	sparkBucket = time.Minute
)

// failedPageSize is how many failed rows one page lists.
const failedPageSize = 50

// tableView is one table (or consumer group) on the overview.
type tableView struct {
	Name    string
	Kind    string
	Group   string
	Missing bool // the table does not exist: run omnibus migrate
	Behind  bool // migrations to apply
	O       postgres.Overview
	Leases  []postgres.LeaseHolder
	Spark   sparkline
	Groups  []tableView
}

func (c *Console) tableViews(ctx context.Context) ([]tableView, error) {
	var out []tableView
	for _, a := range c.tables {
		v := tableView{Name: a.Table().Name, Kind: a.Table().Kind.String()}
		st, err := a.SchemaState(ctx)
		if err != nil {
			return nil, err
		}
		if !st.Exists {
			v.Missing = true
			out = append(out, v)
			continue
		}
		v.Behind = st.Behind()
		if err := c.fillView(ctx, a, &v); err != nil {
			return nil, err
		}
		groups, err := a.ConsumerGroups(ctx)
		if err != nil {
			return nil, err
		}
		for _, g := range groups {
			ga, err := a.WithConsumerGroup(g)
			if err != nil {
				return nil, err
			}
			gv := tableView{Name: v.Name, Kind: v.Kind, Group: g}
			if err := c.fillView(ctx, ga, &gv); err != nil {
				return nil, err
			}
			v.Groups = append(v.Groups, gv)
		}
		out = append(out, v)
	}
	return out, nil
}

func (c *Console) fillView(ctx context.Context, a *postgres.Admin, v *tableView) error {
	var err error
	if v.O, err = a.Overview(ctx); err != nil {
		return err
	}
	if v.Leases, err = a.Leases(ctx); err != nil {
		return err
	}
	v.Spark = c.spark(a)
	return nil
}

// sparkEntry is the last sparkline computed for one table (and group).
type sparkEntry struct {
	line       sparkline
	at         time.Time
	refreshing bool
}

// spark returns the table's sparkline as last computed, and starts
// computing it again in the background when it is a bucket old. Reading an
// hour of completed rows costs what an hour of traffic costs, so no page
// waits for it, and it runs at most once a minute per table and group
// whatever the number of viewers.
func (c *Console) spark(a *postgres.Admin) sparkline {
	key := a.Table().Name + "\x00" + a.ConsumerGroup()
	c.sparkMu.Lock()
	defer c.sparkMu.Unlock()
	e := c.sparks[key]
	if e == nil {
		e = &sparkEntry{}
		c.sparks[key] = e
	}
	if !e.refreshing && time.Since(e.at) >= sparkBucket && c.ctx.Err() == nil {
		e.refreshing = true
		c.wg.Add(1)
		go c.refreshSpark(a, e)
	}
	return e.line
}

func (c *Console) refreshSpark(a *postgres.Admin, e *sparkEntry) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	counts, err := a.Throughput(ctx, sparkWindow, sparkBucket)
	c.sparkMu.Lock()
	defer c.sparkMu.Unlock()
	e.refreshing, e.at = false, time.Now() // a failure, too, waits a bucket before the next try
	if err != nil {
		c.log.Warn("console: throughput", "table", a.Table().Name, "error", err)
		return
	}
	e.line = newSparkline(counts)
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	views, err := c.tableViews(r.Context())
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "overview", err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", views)
}

// overviewLive is the overview's figures alone, for the page's refresh.
func (c *Console) overviewLive(w http.ResponseWriter, r *http.Request) {
	views, err := c.tableViews(r.Context())
	if err != nil {
		c.log.Error("console: overview refresh", "error", err)
		http.Error(w, "the database query failed; see the console's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages["overview"].ExecuteTemplate(w, "live", views); err != nil {
		c.log.Error("console: render overview refresh", "error", err)
	}
}

// heldView is the held keys page.
type heldView struct {
	Tables []heldTable
	Topic  string
}

type heldTable struct {
	Name string
	Keys []postgres.HeldKey
}

func (c *Console) held(w http.ResponseWriter, r *http.Request) {
	v := heldView{Topic: r.FormValue("topic")}
	for _, a := range c.tables {
		if name := r.FormValue("t"); name != "" && name != a.Table().Name {
			continue
		}
		keys, err := a.HeldKeys(r.Context(), v.Topic, 0)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "held keys", err)
			return
		}
		v.Tables = append(v.Tables, heldTable{Name: a.Table().Name, Keys: keys})
	}
	c.render(w, r, http.StatusOK, "held", "Held keys", v)
}

// failedView is the failed rows page.
type failedView struct {
	Table    string
	Group    string
	Tables   []string
	Filter   filterForm
	Rows     []postgres.FailedRow
	Matching int64
	Next     int64 // after= of the next page; 0 when none
}

// filterForm is a failed-rows filter as the form sends it.
type filterForm struct {
	Topic, Key, Error, From, To string
}

// timeLayout is how the filter's times are written (UTC, as
// <input type="datetime-local"> sends them).
const timeLayout = "2006-01-02T15:04"

func readFilter(r *http.Request) (filterForm, postgres.FailedFilter, error) {
	ff := filterForm{Topic: r.FormValue("topic"), Key: r.FormValue("key"), Error: r.FormValue("error"),
		From: r.FormValue("from"), To: r.FormValue("to")}
	f := postgres.FailedFilter{Topic: ff.Topic, PartitionKey: ff.Key, ErrorContains: ff.Error}
	var err error
	if ff.From != "" {
		if f.CreatedFrom, err = time.Parse(timeLayout, ff.From); err != nil {
			return ff, f, errors.New("from: not a time like 2006-01-02T15:04 (UTC)")
		}
	}
	if ff.To != "" {
		if f.CreatedBefore, err = time.Parse(timeLayout, ff.To); err != nil {
			return ff, f, errors.New("to: not a time like 2006-01-02T15:04 (UTC)")
		}
	}
	return ff, f, nil
}

func (c *Console) failed(w http.ResponseWriter, r *http.Request) {
	if r.FormValue("t") == "" {
		r.Form.Set("t", c.tables[0].Table().Name)
	}
	a, err := c.admin(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error(), nil)
		return
	}
	ff, f, err := readFilter(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "filter: "+err.Error(), nil)
		return
	}
	var after int64
	if s := r.FormValue("after"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			c.fail(w, r, http.StatusBadRequest, "after: not a row id: "+strconv.Quote(s), nil)
			return
		}
	}
	v := failedView{Table: a.Table().Name, Group: a.ConsumerGroup(), Filter: ff}
	for _, t := range c.tables {
		v.Tables = append(v.Tables, t.Table().Name)
	}
	if v.Rows, err = a.ListFailedMatching(r.Context(), f, failedPageSize, after); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "failed rows", err)
		return
	}
	if v.Matching, err = a.CountFailedMatching(r.Context(), f); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "failed rows", err)
		return
	}
	if len(v.Rows) == failedPageSize {
		v.Next = v.Rows[len(v.Rows)-1].ID
	}
	c.render(w, r, http.StatusOK, "failed", "Failed rows", v)
}

// rowView is the row detail page.
type rowView struct {
	Table       string
	Row         postgres.Row
	Metadata    string
	Payload     string
	PayloadKind string
	Lane        *postgres.LaneState
}

func (c *Console) row(w http.ResponseWriter, r *http.Request) {
	a, err := c.admin(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error(), nil)
		return
	}
	id, err := strconv.ParseInt(r.FormValue("id"), 10, 64)
	if err != nil || id < 1 {
		c.fail(w, r, http.StatusBadRequest, "id: not a row id: "+strconv.Quote(r.FormValue("id")), nil)
		return
	}
	row, err := a.Row(r.Context(), id)
	if errors.Is(err, postgres.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "no row "+strconv.FormatInt(id, 10)+" in "+a.Table().Name, nil)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "row", err)
		return
	}
	v := rowView{Table: a.Table().Name, Row: row}
	v.Metadata, _ = formatPayload(row.Metadata)
	v.Payload, v.PayloadKind = formatPayload(row.Payload)
	if row.PartitionKey != "" {
		lane, ok, err := a.Lane(r.Context(), row.ConsumerGroup, row.Topic, row.PartitionKey)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "row", err)
			return
		}
		if ok {
			v.Lane = &lane
		}
	}
	c.render(w, r, http.StatusOK, "row", "Row "+strconv.FormatInt(id, 10), v)
}

// relaysView is the relays page.
type relaysView struct {
	Tables []relaysTable
}

type relaysTable struct {
	Name   string
	Leases []postgres.LeaseHolder
}

func (c *Console) relays(w http.ResponseWriter, r *http.Request) {
	var v relaysView
	for _, a := range c.tables {
		leases, err := a.Leases(r.Context())
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "relays", err)
			return
		}
		v.Tables = append(v.Tables, relaysTable{Name: a.Table().Name, Leases: leases})
	}
	c.render(w, r, http.StatusOK, "relays", "Relays", v)
}
