package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
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

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
