package sqlfile

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse_BlocksKeepTheirSQLWithoutTheirDocComments(t *testing.T) {
	fsys := fstest.MapFS{
		"q/a.sql": {Data: []byte(`-- file comment
-- name: First
-- what First does
SELECT 1
  -- a comment inside the SQL stays
FROM {T}

-- A comment on what follows.
-- fragment: Cond
AND x = @x
-- name: Second
SELECT 2`)},
		"q/notes.txt": {Data: []byte("-- name: Ignored\nSELECT 3")},
	}
	s, err := Parse(fsys, "q")
	require.NoError(t, err)
	assert.Equal(t, []string{"First", "Cond", "Second"}, s.Names())
	assert.Equal(t, "SELECT 1\n  -- a comment inside the SQL stays\nFROM {T}", s.Block("First").SQL)
	assert.True(t, s.Block("Cond").Fragment)
	assert.Equal(t, "AND x = @x", s.Block("Cond").SQL)
	assert.Equal(t, `SELECT 1
  -- a comment inside the SQL stays
FROM "t"`, s.Render("First", strings.NewReplacer("{T}", `"t"`)))
	assert.Equal(t, map[string]bool{"First": true, "Cond": true}, s.LookedUp())
}

func TestParse_RejectsDuplicateEmptyAndBadNames(t *testing.T) {
	for name, body := range map[string]string{
		"defined twice": "-- name: A\nSELECT 1\n-- name: A\nSELECT 2",
		"has no SQL":    "-- name: A\n-- only a comment\n-- name: B\nSELECT 1",
		"CamelCase":     "-- name: not_camel\nSELECT 1",
		"no named":      "SELECT 1",
	} {
		_, err := Parse(fstest.MapFS{"q/a.sql": {Data: []byte(body)}}, "q")
		assert.ErrorContains(t, err, name)
	}
}

func TestRender_PanicsOnAMissingNameOrAnUnfilledPlaceholder(t *testing.T) {
	s, err := Parse(fstest.MapFS{"q/a.sql": {Data: []byte("-- name: A\nSELECT * FROM {T} WHERE x = '{}'")}}, "q")
	require.NoError(t, err)
	assert.PanicsWithValue(t, `sqlfile: no statement named "B" (the .sql files define A)`, func() { s.Render("B", nil) })
	assert.PanicsWithValue(t, `sqlfile: statement A: placeholder {T} has no value`, func() { s.Render("A", nil) })
	assert.Equal(t, `SELECT * FROM "t" WHERE x = '{}'`, s.Render("A", strings.NewReplacer("{T}", `"t"`)))
}
