// Package sqlfile reads named SQL statements from embedded .sql files, in the
// style of River's (sqlc) query files:
//
//	-- name: FailedCeiling
//	-- Any comment lines right after the name document the statement; they
//	-- are not sent to the server.
//	SELECT max(t.id) FROM {T} t WHERE t.status = 'failed'
//
// A block runs from its "-- name:" line to the next one (or the end of the
// file); comment lines at its end belong to what follows. A "-- fragment:" block is a piece of SQL that statements are
// assembled from (a condition added only when a filter asks for it); it is
// looked up like a statement but is not a statement of its own. Lines before
// a file's first block are the file's comment. Names are unique across the
// files of a Set.
//
// Templated parts are written {LIKE_THIS}; a caller renders a statement by
// giving a value for each (in omnibus, quoted identifiers built from
// validated names). Rendering a statement that still has a placeholder
// without a value, or looking up a name no file defines, panics: both are
// programming errors that a test catches, never conditions of a running
// system.
package sqlfile

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Block is one named statement or fragment.
type Block struct {
	Name     string
	File     string // the file that defines it, relative to the Set's root
	Fragment bool   // a "-- fragment:" block, not a statement of its own
	SQL      string // the text, placeholders not rendered, doc comment removed
}

// Set is the named blocks of a folder of .sql files. It is safe for
// concurrent use.
type Set struct {
	blocks map[string]Block
	order  []string

	mu     sync.Mutex
	looked map[string]bool
}

var (
	headerRE      = regexp.MustCompile(`^--\s*(name|fragment):\s*(\S+)\s*$`)
	nameRE        = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	placeholderRE = regexp.MustCompile(`\{[A-Z][A-Z0-9_]*\}`)
)

// MustParse is Parse that panics on error, for package-level Sets over
// embedded files.
func MustParse(fsys fs.FS, dir string) *Set {
	s, err := Parse(fsys, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// Parse reads every .sql file directly in dir of fsys.
func Parse(fsys fs.FS, dir string) (*Set, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("sqlfile: read %s: %w", dir, err)
	}
	s := &Set{blocks: map[string]Block{}, looked: map[string]bool{}}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("sqlfile: read %s: %w", e.Name(), err)
		}
		if err := s.parseFile(e.Name(), string(body)); err != nil {
			return nil, err
		}
	}
	if len(s.blocks) == 0 {
		return nil, fmt.Errorf("sqlfile: no named blocks in %s", dir)
	}
	return s, nil
}

func (s *Set) parseFile(file, body string) error {
	var (
		cur   *Block
		lines []string
		doc   bool // still in the doc comment right after the header
	)
	flush := func() error {
		if cur == nil {
			return nil
		}
		// Comment lines after the SQL belong to what follows (a comment
		// on a group of blocks), not to this statement.
		for len(lines) > 0 {
			last := strings.TrimSpace(lines[len(lines)-1])
			if last != "" && !strings.HasPrefix(last, "--") {
				break
			}
			lines = lines[:len(lines)-1]
		}
		cur.SQL = strings.TrimSpace(strings.Join(lines, "\n"))
		if cur.SQL == "" {
			return fmt.Errorf("sqlfile: %s: %s has no SQL", file, cur.Name)
		}
		s.blocks[cur.Name] = *cur
		s.order = append(s.order, cur.Name)
		return nil
	}
	for i, line := range strings.Split(body, "\n") {
		if m := headerRE.FindStringSubmatch(line); m != nil {
			if err := flush(); err != nil {
				return err
			}
			name := m[2]
			if !nameRE.MatchString(name) {
				return fmt.Errorf("sqlfile: %s:%d: name %q: want CamelCase letters and digits", file, i+1, name)
			}
			if prev, dup := s.blocks[name]; dup {
				return fmt.Errorf("sqlfile: %s:%d: %s is defined twice (first in %s)", file, i+1, name, prev.File)
			}
			cur, lines, doc = &Block{Name: name, File: file, Fragment: m[1] == "fragment"}, nil, true
			continue
		}
		if cur == nil {
			continue // the file's comment
		}
		trimmed := strings.TrimSpace(line)
		if doc && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue
		}
		doc = false
		lines = append(lines, strings.TrimRight(line, " \t\r"))
	}
	return flush()
}

// Names returns every block's name, files in name order, blocks in file order.
func (s *Set) Names() []string { return slices.Clone(s.order) }

// Block returns the block called name, recording the lookup; it panics when
// no file defines name.
func (s *Set) Block(name string) Block {
	b, ok := s.blocks[name]
	if !ok {
		panic(fmt.Sprintf("sqlfile: no statement named %q (the .sql files define %s)", name, strings.Join(s.order, ", ")))
	}
	s.mu.Lock()
	s.looked[name] = true
	s.mu.Unlock()
	return b
}

// Render returns the statement called name with its placeholders replaced
// by r (nil for a statement without placeholders). It panics when name is
// not defined or a placeholder is left without a value.
func (s *Set) Render(name string, r *strings.Replacer) string {
	sql := s.Block(name).SQL
	if r != nil {
		sql = r.Replace(sql)
	}
	if p := placeholderRE.FindString(sql); p != "" {
		panic(fmt.Sprintf("sqlfile: statement %s: placeholder %s has no value", name, p))
	}
	return sql
}

// LookedUp reports the names looked up so far (by Block or Render).
func (s *Set) LookedUp() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.looked))
	for k := range s.looked {
		out[k] = true
	}
	return out
}

// Unreferenced returns the names of s that no string literal in the
// non-test Go files of dir spells out: statements no code can look up any
// more. A test calls it so that a statement that became dead fails the
// build's tests instead of lingering in the files.
func Unreferenced(s *Set, dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil {
					seen[v] = true
				}
			}
			return true
		})
	}
	var out []string
	for _, name := range s.order {
		if !seen[name] {
			out = append(out, name)
		}
	}
	return out, nil
}
