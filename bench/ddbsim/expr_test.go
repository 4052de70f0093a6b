package ddbsim

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// item decodes an item from DynamoDB JSON (numbers normalized).
func item(t *testing.T, js string) Item {
	t.Helper()
	var it Item
	require.NoError(t, json.Unmarshal([]byte(js), &it))
	require.Nil(t, checkItem(it))
	return it
}

func values(t *testing.T, js string) map[string]*Value {
	t.Helper()
	if js == "" {
		return nil
	}
	var v map[string]*Value
	require.NoError(t, json.Unmarshal([]byte(js), &v))
	return v
}

const sample = `{"pk":{"S":"k"},"n":{"N":"10"},"s":{"S":"hello"},"b":{"BOOL":true},"nul":{"NULL":true},
	"ss":{"SS":["a","b"]},"ns":{"NS":["1","2"]},"l":{"L":[{"S":"x"},{"N":"2"},{"M":{"q":{"S":"deep"}}}]},
	"m":{"M":{"a":{"N":"1"},"state":{"S":"on"}}},"big":{"N":"1893562245000000000"}}`

func TestCondition_Eval(t *testing.T) {
	it := item(t, sample)
	vals := `{":10":{"N":"10"},":9":{"N":"9"},":11":{"N":"11"},":s":{"S":"hello"},":he":{"S":"he"},":a":{"S":"a"},
		":x":{"S":"x"},":S":{"S":"S"},":L":{"S":"L"},":5":{"N":"5"},":one":{"N":"1"},":two":{"N":"2"},":t":{"BOOL":true},
		":big":{"N":"1893562245000000001"},":on":{"S":"on"},":ten":{"S":"10"},":deep":{"S":"deep"},":m2":{"M":{"q":{"S":"deep"}}}}`
	tests := []struct {
		name, expr string
		names      string
		want       bool
	}{
		{"equal number", "n = :10", "", true},
		{"number and string never equal", "n = :ten", "", false},
		{"not equal across types is true", "n <> :ten", "", true},
		{"missing attribute: comparison false", "nope = :10", "", false},
		{"missing attribute: <> true", "nope <> :10", "", true},
		{"less", "n < :11 AND n > :9 AND n <= :10 AND n >= :10", "", true},
		{"ordering across types is false", "s > :10", "", false},
		{"19-digit numbers compare exactly", "big < :big", "", true},
		{"between", "n BETWEEN :9 AND :11", "", true},
		{"between excludes", "n BETWEEN :11 AND :11", "", false},
		{"in", "s IN (:a, :s)", "", true},
		{"in misses", "s IN (:a, :x)", "", false},
		{"attribute_exists", "attribute_exists(n) AND attribute_not_exists(nope)", "", true},
		{"attribute_type", "attribute_type(s, :S) AND attribute_type(l, :L)", "", true},
		{"begins_with", "begins_with(s, :he)", "", true},
		{"contains string", "contains(s, :he)", "", true},
		{"contains set", "contains(ss, :a) AND contains(ns, :two)", "", true},
		{"contains list", "contains(l, :x) AND contains(l, :m2)", "", true},
		{"size", "size(s) = :5 AND size(l) > :two AND size(m) = :two", "", true},
		{"size of a missing attribute is false", "size(nope) = :5", "", false},
		{"nested path and list index", "l[2].q = :deep AND m.a = :one", "", true},
		{"placeholder for a reserved word", "m.#st = :on", `{"#st":"state"}`, true},
		{"precedence: AND binds tighter than OR", "n = :9 AND n = :9 OR n = :10", "", true},
		{"parentheses", "n = :9 AND (n = :9 OR n = :10)", "", false},
		{"NOT", "NOT n = :9 AND NOT attribute_exists(nope)", "", true},
		{"bool", "b = :t", "", true},
		{"keywords are case-insensitive", "n = :10 and not n = :9 Or n between :9 and :11", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var names map[string]string
			if tc.names != "" {
				require.NoError(t, json.Unmarshal([]byte(tc.names), &names))
			}
			vs := values(t, vals)
			for _, v := range vs {
				require.Nil(t, v.check(1))
			}
			c, err := parseCondition(newExprContext(names, vs), kindCondition, tc.expr)
			require.Nil(t, err)
			assert.Equal(t, tc.want, c.eval(it))
		})
	}
}

func TestExpressions_RefusedAsDynamoDBRefusesThem(t *testing.T) {
	tests := []struct {
		name, kind, expr, names, vals, want string
	}{
		{"reserved word", kindCondition, "state = :v", "", `{":v":{"S":"a"}}`,
			"Invalid ConditionExpression: Attribute name is a reserved keyword; reserved keyword: state"},
		{"undefined name", kindCondition, "#x = :v", "", `{":v":{"S":"a"}}`,
			"Invalid ConditionExpression: An expression attribute name used in the document path is not defined; attribute name: #x"},
		{"undefined value", kindUpdate, "SET a = :nope", "", `{":v":{"S":"a"}}`,
			"Invalid UpdateExpression: An expression attribute value used in expression is not defined; attribute value: :nope"},
		{"unused value", kindCondition, "a = :v", "", `{":v":{"S":"a"},":w":{"S":"b"}}`,
			"Value provided in ExpressionAttributeValues unused in expressions: keys: {:w}"},
		{"unused name", kindCondition, "a = :v", `{"#n":"b"}`, `{":v":{"S":"a"}}`,
			"Value provided in ExpressionAttributeNames unused in expressions: keys: {#n}"},
		{"syntax", kindCondition, "a = ", "", `{":v":{"S":"a"}}`, `Invalid ConditionExpression: Syntax error; token: "<EOF>", near: "a ="`},
		{"unknown function", kindCondition, "nosuch(a)", "", "", "Invalid ConditionExpression: Invalid function name; function: nosuch"},
		{"ordering a bool", kindCondition, "a < :t", "", `{":t":{"BOOL":true}}`,
			"Invalid ConditionExpression: Incorrect operand type for operator or function; operator or function: <, operand type: BOOL"},
		{"bad attribute type", kindCondition, "attribute_type(a, :t)", "", `{":t":{"S":"X"}}`,
			"Invalid ConditionExpression: Invalid attribute type name found; type: X, valid types: {B,NULL,SS,BOOL,L,BS,N,NS,S,M}"},
		{"overlapping update paths", kindUpdate, "SET a = :v, a.b = :v", "", `{":v":{"S":"a"}}`,
			"Invalid UpdateExpression: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [a], path two: [a, b]"},
		{"clause twice", kindUpdate, "SET a = :v SET b = :v", "", `{":v":{"S":"a"}}`,
			`Invalid UpdateExpression: The "SET" section can only be used once in an update expression;`},
		{"ADD a string", kindUpdate, "ADD a :v", "", `{":v":{"S":"a"}}`,
			"Invalid UpdateExpression: Incorrect operand type for operator or function; operator: ADD, operand type: STRING"},
		{"condition function in an update", kindUpdate, "SET a = size(b)", "", "",
			"Invalid UpdateExpression: The function is not allowed in an update expression; function: size"},
		{"size as a condition", kindCondition, "size(a)", "", "",
			`Invalid ConditionExpression: Syntax error; token: "<EOF>", near: "a)"`},
		{"overlapping projection", kindProjection, "a.b, a", "", "",
			"Invalid ProjectionExpression: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [a, b], path two: [a]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var names map[string]string
			if tc.names != "" {
				require.NoError(t, json.Unmarshal([]byte(tc.names), &names))
			}
			x := newExprContext(names, values(t, tc.vals))
			require.Nil(t, x.checkInputs())
			var err *apiError
			switch tc.kind {
			case kindUpdate:
				_, err = parseUpdate(x, tc.expr)
			case kindProjection:
				_, err = parseProjection(x, tc.expr)
			default:
				_, err = parseCondition(x, tc.kind, tc.expr)
			}
			if err == nil {
				err = x.checkUnused()
			}
			require.NotNil(t, err)
			assert.Equal(t, codeValidation, err.code)
			assert.Equal(t, tc.want, err.message)
		})
	}
}

func TestUpdate_Apply(t *testing.T) {
	vals := `{":one":{"N":"1"},":five":{"N":"5"},":x":{"S":"x"},":l":{"L":[{"S":"z"}]},":c":{"SS":["c"]},":a":{"SS":["a"]},
		":ab":{"SS":["a","b"]},":ns":{"NS":["7"]},":v":{"S":"v"}}`
	tests := []struct {
		name, expr, want string
	}{
		{"SET arithmetic reads the item as it was", "SET n = n + :one, o = n - :five",
			`{"pk":{"S":"k"},"n":{"N":"11"},"o":{"N":"5"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]},"ss":{"SS":["a","b"]}}`},
		{"if_not_exists", "SET n = if_not_exists(n, :five), fresh = if_not_exists(fresh, :five)",
			`{"pk":{"S":"k"},"n":{"N":"10"},"fresh":{"N":"5"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]},"ss":{"SS":["a","b"]}}`},
		{"list_append and an index past the end", "SET l = list_append(l, :l)",
			`{"pk":{"S":"k"},"n":{"N":"10"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"},{"S":"z"}]},"ss":{"SS":["a","b"]}}`},
		{"REMOVE list elements by their old index", "REMOVE l[0], l[2]",
			`{"pk":{"S":"k"},"n":{"N":"10"},"l":{"L":[{"S":"b"}]},"ss":{"SS":["a","b"]}}`},
		{"ADD numbers, sets and missing attributes", "ADD n :one, ss :c, fresh :ns",
			`{"pk":{"S":"k"},"n":{"N":"11"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]},"ss":{"SS":["a","b","c"]},"fresh":{"NS":["7"]}}`},
		{"DELETE from a set; an emptied set goes", "DELETE ss :ab",
			`{"pk":{"S":"k"},"n":{"N":"10"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]}}`},
		{"clauses in any order", "REMOVE n ADD ss :c SET x = :x",
			`{"pk":{"S":"k"},"x":{"S":"x"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]},"ss":{"SS":["a","b","c"]}}`},
	}
	base := `{"pk":{"S":"k"},"n":{"N":"10"},"l":{"L":[{"S":"a"},{"S":"b"},{"S":"c"}]},"ss":{"SS":["a","b"]}}`
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := item(t, base)
			x := newExprContext(nil, values(t, vals))
			require.Nil(t, x.checkInputs())
			u, err := parseUpdate(x, tc.expr)
			require.Nil(t, err)
			got, err := u.apply(old, Item{"pk": old["pk"]})
			require.Nil(t, err)
			assert.True(t, itemsEqual(item(t, tc.want), got), "got %s", mustJSON(t, got))
			assert.True(t, itemsEqual(item(t, base), old), "the old item is not modified")
		})
	}
	failing := []struct{ name, expr, want string }{
		{"arithmetic on a missing attribute", "SET n = nope + :one", msgNoSuchAttr},
		{"arithmetic on a string", "SET n = pk + :one", msgWrongDataType},
		{"a nested path without its parent", "SET nope.deeper = :v", msgPathInvalid},
		{"ADD to a list", "ADD l :one", msgWrongDataType},
	}
	for _, tc := range failing {
		t.Run(tc.name, func(t *testing.T) {
			x := newExprContext(nil, values(t, vals))
			require.Nil(t, x.checkInputs())
			u, err := parseUpdate(x, tc.expr)
			require.Nil(t, err)
			_, err = u.apply(item(t, base), nil)
			require.NotNil(t, err)
			assert.Equal(t, tc.want, err.message)
		})
	}
}

func itemsEqual(a, b Item) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !equal(v, w) {
			return false
		}
	}
	return true
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestProject_NestedPathsAndListElements(t *testing.T) {
	it := item(t, sample)
	x := newExprContext(map[string]string{"#st": "state"}, nil)
	paths, err := parseProjection(x, "m.#st, l[2].q, l[0], n, nope")
	require.Nil(t, err)
	got := project(it, paths)
	want := item(t, `{"m":{"M":{"state":{"S":"on"}}},"l":{"L":[{"S":"x"},{"M":{"q":{"S":"deep"}}}]},"n":{"N":"10"}}`)
	assert.True(t, itemsEqual(want, got), "got %s", mustJSON(t, got))
}

func TestNumbers_NormalizedComparedAddedExactly(t *testing.T) {
	for in, want := range map[string]string{
		"1.50": "1.5", "-0": "0", "1e3": "1000", "+.5": "0.5", "0.000100": "0.0001", "007": "7", "-12.0e-1": "-1.2",
	} {
		d, err := parseNumber(in)
		require.Nil(t, err, in)
		assert.Equal(t, want, d.String(), in)
	}
	for _, bad := range []string{"", "abc", "1e", "--1", "1.2.3", "1" + string(make([]byte, 0)) + "e99999"} {
		_, err := parseNumber(bad)
		assert.NotNil(t, err, bad)
	}
	_, err := parseNumber("123456789012345678901234567890123456789") // 39 digits
	require.NotNil(t, err)
	assert.Contains(t, err.message, "38 significant digits")
	assert.Equal(t, -1, cmpNumber("1893562245000000000", "1893562245000000001"))
	assert.Equal(t, 1, cmpNumber("-1", "-2"))
	assert.Equal(t, 0, cmpNumber("1.5", "1.50"))
	a, _ := parseNumber("1893562245000000000")
	b, _ := parseNumber("0.5")
	sum, err := addDecimal(a, b, true)
	require.Nil(t, err)
	assert.Equal(t, "1893562244999999999.5", sum.String())
	assert.Equal(t, 2, numberSize("100"), "trailing zeros are not significant")
	assert.Equal(t, 11, numberSize("1893562245000000001"))
}
