package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/omnibus-go/omnibus/transports/postgres"
)

// maxSelection bounds the rows one requeue or discard of a selection takes.
const maxSelection = 1000

// Actions, as the form's action field names them.
const (
	actRequeue         = "requeue"          // the rows id=…
	actRequeueMatching = "requeue-matching" // every failed row the filter selects
	actDiscard         = "discard"          // the rows id=…
	actReleaseLeases   = "release-leases"
	actSweepLanes      = "sweep-lanes"
)

// plan is an action checked and described, before or after confirmation.
type plan struct {
	Action string
	Table  string
	Group  string
	Title  string
	// What tells what the action will do, Notes what the operator must know
	// (a blocked key, order).
	What   string
	Notes  []string
	IDs    []int64
	Filter filterForm
	Back   string

	filter postgres.FailedFilter
}

// resultView is the page after an action.
type resultView struct {
	Plan    plan
	Message string
	Errors  []string
}

func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "the console is read-only: actions are disabled", nil)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "unreadable form", nil)
		return
	}
	if !c.checkCSRF(r) {
		c.log.Warn("console: action refused: bad CSRF token", "remote", r.RemoteAddr)
		c.fail(w, r, http.StatusForbidden, "invalid or missing CSRF token: reload the page and try again", nil)
		return
	}
	a, err := c.admin(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error(), nil)
		return
	}
	p, err := c.plan(r.Context(), a, r)
	var bad *badInput
	switch {
	case errors.As(err, &bad):
		c.fail(w, r, http.StatusBadRequest, bad.msg, nil)
		return
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, p.Action, err)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.render(w, r, http.StatusOK, "confirm", "Confirm: "+p.Title, p)
		return
	}
	res := c.run(r.Context(), a, p, r.RemoteAddr)
	c.render(w, r, http.StatusOK, "result", p.Title, res)
}

// badInput is a request the operator must correct.
type badInput struct{ msg string }

func (e *badInput) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badInput{fmt.Sprintf(format, args...)} }

func (c *Console) plan(ctx context.Context, a *postgres.Admin, r *http.Request) (plan, error) {
	p := plan{Action: r.PostFormValue("action"), Table: a.Table().Name, Group: a.ConsumerGroup(), Back: localPath(r.PostFormValue("back"))}
	switch p.Action {
	case actRequeue, actDiscard:
		ids := r.PostForm["id"]
		if len(ids) == 0 {
			return p, badf("%s: select at least one row", p.Action)
		}
		if len(ids) > maxSelection {
			return p, badf("%s: at most %d rows at once, got %d; use requeue all matching", p.Action, maxSelection, len(ids))
		}
		for _, s := range ids {
			id, err := strconv.ParseInt(s, 10, 64)
			if err != nil || id < 1 {
				return p, badf("%s: %q is not a row id", p.Action, s)
			}
			p.IDs = append(p.IDs, id)
		}
		verb := "Requeue"
		p.What = fmt.Sprintf("%s %d failed row(s) of %s: they become pending with 0 attempts spent, due now, and a relay delivers them on its next fetch.",
			verb, len(p.IDs), describe(a))
		if p.Action == actDiscard {
			verb = "Discard"
			p.What = fmt.Sprintf("Discard %d failed row(s) of %s: they are deleted for good and never delivered.", len(p.IDs), describe(a))
		} else {
			p.Notes = append(p.Notes, outOfOrderNote)
		}
		p.Title = fmt.Sprintf("%s %s", verb, rowsLabel(p.IDs))
		for _, id := range p.IDs {
			note, err := blockNote(ctx, a, id, p.Action)
			if err != nil {
				return p, err
			}
			if note != "" {
				p.Notes = append(p.Notes, note)
			}
		}
	case actRequeueMatching:
		ff, f, err := readFilter(r)
		if err != nil {
			return p, badf("requeue all matching: filter: %v", err)
		}
		p.Filter, p.filter = ff, f
		n, err := a.CountFailedMatching(ctx, f)
		if err != nil {
			return p, err
		}
		p.Title = "Requeue all matching failed rows"
		p.What = fmt.Sprintf("Requeue the %d failed row(s) of %s that match %s: they become pending with 0 attempts spent, due now.",
			n, describe(a), describeFilter(ff))
		p.Notes = append(p.Notes, outOfOrderNote)
		o, err := a.Overview(ctx)
		if err != nil {
			return p, err
		}
		if o.BlockedKeys > 0 {
			p.Notes = append(p.Notes, fmt.Sprintf("%d key(s) of this table are blocked behind a failed row (Block policy): requeueing their failed rows lifts the block.", o.BlockedKeys))
		}
	case actReleaseLeases:
		p.Title = "Release expired leases"
		p.What = fmt.Sprintf("Clear the expired leases on pending rows and lanes of %s (workers that stopped without settling). Live leases are not touched.", describe(a))
	case actSweepLanes:
		p.Title = "Sweep lanes"
		p.What = fmt.Sprintf("Create the missing lane of every key of %s that has pending rows but no lane, so relays see those keys again.", a.Table().Name)
	default:
		return p, badf("unknown action %q", p.Action)
	}
	return p, nil
}

const outOfOrderNote = "Under the default failed policy (skip) the rows of a key that went on without a failed row were delivered already: a requeued row is delivered after them, out of order."

// blockNote tells whether the key of row id is blocked behind it.
func blockNote(ctx context.Context, a *postgres.Admin, id int64, action string) (string, error) {
	row, err := a.Row(ctx, id)
	if errors.Is(err, postgres.ErrNotFound) {
		return fmt.Sprintf("There is no row %d.", id), nil
	}
	if err != nil {
		return "", err
	}
	if row.Status != "failed" {
		return fmt.Sprintf("Row %d is %s, not failed: it is left alone.", id, row.Status), nil
	}
	if row.PartitionKey == "" {
		return "", nil
	}
	lane, ok, err := a.Lane(ctx, row.ConsumerGroup, row.Topic, row.PartitionKey)
	if err != nil || !ok || !lane.Blocked {
		return "", err
	}
	verb := "requeueing"
	if action == actDiscard {
		verb = "discarding"
	}
	return fmt.Sprintf("Key %q of topic %q is blocked behind a failed row (Block policy): %s row %d lifts the block, and the key's pending rows are delivered after it.",
		row.PartitionKey, row.Topic, verb, id), nil
}

// run carries out a confirmed plan.
func (c *Console) run(ctx context.Context, a *postgres.Admin, p plan, remote string) resultView {
	res := resultView{Plan: p}
	log := c.log.With("table", p.Table, "action", p.Action, "remote", remote)
	switch p.Action {
	case actRequeue, actDiscard:
		var done int
		for _, id := range p.IDs {
			var err error
			if p.Action == actRequeue {
				err = a.Requeue(ctx, id)
			} else {
				var eventID string
				eventID, err = a.Discard(ctx, id)
				if err == nil {
					log.Info("console: discarded a failed row", "id", id, "event_id", eventID)
				}
			}
			switch {
			case errors.Is(err, postgres.ErrNotFound):
				res.Errors = append(res.Errors, fmt.Sprintf("row %d: no failed row has this id (requeued, discarded or never failed)", id))
			case err != nil:
				log.Error("console: action on a row", "id", id, "error", err)
				res.Errors = append(res.Errors, fmt.Sprintf("row %d: the database query failed; see the console's log", id))
			default:
				done++
			}
		}
		verb := "Requeued"
		if p.Action == actDiscard {
			verb = "Discarded"
		}
		res.Message = fmt.Sprintf("%s %d of %d row(s) of %s.", verb, done, len(p.IDs), describe(a))
		log.Info("console: "+strings.ToLower(verb), "rows", done, "ids", p.IDs)
	case actRequeueMatching:
		n, err := a.RequeueMatching(ctx, p.filter)
		res.Message = fmt.Sprintf("Requeued %d failed row(s) of %s.", n, describe(a))
		if err != nil {
			log.Error("console: requeue matching", "error", err)
			res.Errors = append(res.Errors, "stopped early: the database query failed; see the console's log")
		}
		log.Info("console: requeued matching rows", "rows", n)
	case actReleaseLeases:
		rows, lanes, err := a.ReleaseExpiredLeases(ctx)
		res.Message = fmt.Sprintf("Released the expired leases of %d row(s) and %d lane(s) of %s.", rows, lanes, describe(a))
		if err != nil {
			log.Error("console: release leases", "error", err)
			res.Errors = append(res.Errors, "the database query failed; see the console's log")
		}
		log.Info("console: released expired leases", "rows", rows, "lanes", lanes)
	case actSweepLanes:
		n, err := a.SweepLanes(ctx)
		res.Message = fmt.Sprintf("Created %d missing lane(s) in %s.", n, a.Table().Name)
		if err != nil {
			log.Error("console: sweep lanes", "error", err)
			res.Errors = append(res.Errors, "the database query failed; see the console's log")
		}
		log.Info("console: swept lanes", "created", n)
	}
	return res
}

func describe(a *postgres.Admin) string {
	if g := a.ConsumerGroup(); g != "" {
		return fmt.Sprintf("%s (group %s)", a.Table().Name, g)
	}
	return a.Table().Name
}

func describeFilter(f filterForm) string {
	var parts []string
	for _, kv := range [][2]string{{"topic", f.Topic}, {"key", f.Key}, {"error containing", f.Error},
		{"created from", f.From}, {"created before", f.To}} {
		if kv[1] != "" {
			parts = append(parts, fmt.Sprintf("%s %q", kv[0], kv[1]))
		}
	}
	if len(parts) == 0 {
		return "no filter (every failed row)"
	}
	return strings.Join(parts, ", ")
}

func rowsLabel(ids []int64) string {
	if len(ids) == 1 {
		return "row " + strconv.FormatInt(ids[0], 10)
	}
	return fmt.Sprintf("%d rows", len(ids))
}

// localPath keeps a back link on this site: a path, never another host.
func localPath(s string) string {
	if !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || strings.ContainsAny(s, "\\\r\n") {
		return "/"
	}
	return s
}
