package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/api"
)

// TestCodes_NamesEveryCodeConstant fails when a Code* constant is added
// to the package without a place in Codes(), and when two codes are equal.
func TestCodes_NamesEveryCodeConstant(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	var declared []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Code") {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				require.True(t, ok, "%s is a string literal", name.Name)
				v, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				declared = append(declared, v)
			}
		}
	}
	codes := api.Codes()
	assert.Equal(t, declared, codes, "Codes() lists every Code* constant, in order")
	assert.Len(t, codes, len(uniq(codes)), "no two codes are the same")
	for _, c := range codes {
		assert.Regexp(t, `^[a-z]+(_[a-z]+)*$`, c)
	}
}

// TestCodes_PythonSDKHasAClassForEach reads the Python SDK's errors.py: every
// code has an exception class that says it (code = "...") and is in
// _BY_CODE, which from_response looks codes up in.
func TestCodes_PythonSDKHasAClassForEach(t *testing.T) {
	src := readRepoFile(t, "sdk", "python", "src", "quarry", "errors.py")
	classOf := map[string]string{} // code → class
	for _, block := range strings.Split(src, "\nclass ")[1:] {
		name, _, _ := strings.Cut(block, "(")
		if m := regexp.MustCompile(`\n    code = "([a-z_]*)"`).FindStringSubmatch(block); m != nil {
			classOf[m[1]] = name
		}
	}
	_, byCode, ok := strings.Cut(src, "\n_BY_CODE: ")
	require.True(t, ok, "errors.py has _BY_CODE")
	byCode, _, _ = strings.Cut(byCode, "\n}")
	mapped := regexp.MustCompile(`\w+`).FindAllString(byCode, -1)
	for _, c := range api.Codes() {
		cls, ok := classOf[c]
		if assert.True(t, ok, "errors.py has no class with code = %q", c) {
			assert.Contains(t, mapped, cls, "%s (%s) is in _BY_CODE", cls, c)
		}
	}
}

// TestCodes_DocsAPITableNamesEach holds docs/API.md's error table (the
// first table after "Every error has one shape") to Codes().
func TestCodes_DocsAPITableNamesEach(t *testing.T) {
	doc := readRepoFile(t, "docs", "API.md")
	_, table, ok := strings.Cut(doc, "\n| status | code | when |\n")
	require.True(t, ok, "docs/API.md has the error table")
	table, _, _ = strings.Cut(table, "\n\n")
	var tabled []string
	for _, row := range strings.Split(table, "\n")[1:] {
		cells := strings.Split(row, "|")
		require.Greater(t, len(cells), 3, "row %q", row)
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(cells[2], -1) {
			tabled = append(tabled, m[1])
		}
	}
	assert.ElementsMatch(t, api.Codes(), tabled, "the codes of docs/API.md's error table")
}

// readRepoFile reads a file of the repository by its path from the root.
func readRepoFile(t *testing.T, path ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{".."}, path...)...))
	require.NoError(t, err)
	return string(b)
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
