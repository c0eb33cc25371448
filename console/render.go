package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// pageTemplate is the layout with one page's "content".
type pageTemplate = template.Template

// pageNames are the templates/<name>.html files that are whole pages.
var pageNames = []string{"overview", "held", "failed", "row", "relays", "confirm", "result", "error"}

var funcs = template.FuncMap{
	"age":   formatAge,
	"when":  formatTime,
	"count": formatCount,
	"short": func(s string, n int) string {
		s = strings.Join(strings.Fields(s), " ")
		if r := []rune(s); len(r) > n {
			return string(r[:n-1]) + "…"
		}
		return s
	},
	// q "t" name "id" "3" is the query t=name&id=3 (empty values left out),
	// encoded here so the template does not escape its = and &.
	"q": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
	"itoa": func(n int64) string { return strconv.FormatInt(n, 10) },
	"deref": func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	},
}

func parsePages() (map[string]*pageTemplate, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templatesFS, "templates/layout.html", "templates/live.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*pageTemplate{}
	for _, name := range pageNames {
		t, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if _, err := t.ParseFS(templatesFS, "templates/"+name+".html"); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// page is what every page template gets.
type page struct {
	Title    string
	Nav      string
	ReadOnly bool
	CSRF     string
	Refresh  int64  // milliseconds
	Self     string // this page's path and query, where actions come back to
	Data     any
}

// render writes the page name with status.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Title: title, Nav: name, ReadOnly: c.cfg.ReadOnly, Refresh: c.cfg.RefreshInterval.Milliseconds(),
		Self: localPath(r.URL.RequestURI()), Data: data}
	if !c.cfg.ReadOnly {
		p.CSRF = c.csrfToken(w, r)
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		c.log.Error("console: render page", "page", name, "error", err)
		http.Error(w, "the page could not be rendered; see the console's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail shows an error page. A bad request says what was wrong; a failure
// of the database is logged and shown without its text, which may name
// hosts or users.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	if err != nil {
		c.log.Error("console: "+msg, "path", r.URL.Path, "error", err)
		msg += ": the database query failed; see the console's log"
	}
	c.render(w, r, status, "error", "Error", msg)
}

func formatAge(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// formatCount renders a count with thin grouping ("1 234 567").
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	if len(s) <= 3 || n < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(' ')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// formatPayload renders stored bytes for a page: indented when JSON, as
// text when UTF-8, with each byte that is not written as \xNN otherwise.
// Control characters other than newline and tab are escaped too.
func formatPayload(b []byte) (text, kind string) {
	if len(b) == 0 {
		return "", "empty"
	}
	if json.Valid(b) {
		var out bytes.Buffer
		if json.Indent(&out, b, "", "  ") == nil {
			return out.String(), "JSON"
		}
	}
	kind = "text"
	if !utf8.Valid(b) {
		kind = "bytes (not UTF-8)"
	}
	var s strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&s, `\x%02x`, b[0])
		case r == '\n' || r == '\t':
			s.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&s, `\x%02x`, r)
		default:
			s.WriteRune(r)
		}
		b = b[n:]
	}
	return s.String(), kind
}

// sparkline is an SVG polyline of counts per bucket.
type sparkline struct {
	Ready  bool // computed at least once
	Points string
	Total  int64
	Max    int64
	Width  int
	Height int
}

func newSparkline(counts []int64) sparkline {
	s := sparkline{Ready: true, Width: 180, Height: 28}
	for _, n := range counts {
		s.Total += n
		s.Max = max(s.Max, n)
	}
	if len(counts) < 2 {
		return s
	}
	var b strings.Builder
	for i, n := range counts {
		x := float64(i) * float64(s.Width) / float64(len(counts)-1)
		y := float64(s.Height - 1)
		if s.Max > 0 {
			y = float64(s.Height-1) - float64(n)*float64(s.Height-2)/float64(s.Max)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	s.Points = strings.TrimSpace(b.String())
	return s
}
