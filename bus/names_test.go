package bus

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// bus speaks no broker's language: no identifier or string literal of its
// code names a transport or a word of a transport's configuration. Each
// transport registers its name, its section and its words (Register).
// Comments may still use a broker as an example.
func TestBus_CodeNamesNoTransport(t *testing.T) {
	t.Parallel()
	words := regexp.MustCompile(`(?i)kafka|redis|sarama|sasl|scram|rabbit|amqp|nats|jetstream`)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var found []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			var text string
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					text = n.Value
				}
			case *ast.Ident:
				text = n.Name
			}
			if text != "" && words.MatchString(text) {
				found = append(found, fset.Position(n.Pos()).String()+": "+text)
			}
			return true
		})
	}
	require.Greater(t, len(files), 10, "the test reads the package's own files")
	require.Empty(t, found, "bus names a transport; move the name into the transport's package")
}
