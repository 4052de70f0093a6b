package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/internal/badinput"
)

// Request helpers shared by every route: path and query parameters, names
// and ids, and strict JSON bodies. Every refusal is a *badinput.Error
// naming what is wrong.

// pathID returns the path parameter name, validated as an id and copied
// (fiber's parameters alias the request buffer).
func pathID(c *fiber.Ctx, name string) (string, error) {
	id := c.Params(name)
	if err := checkID(id); err != nil {
		return "", badinput.New(name, "%s", err.Error())
	}
	return strings.Clone(id), nil
}

// checkID accepts 1..128 letters, digits, '.', '_' and '-', not starting
// with '.'.
func checkID(s string) error {
	if s == "" || len(s) > maxIDLen || s[0] == '.' || !isNameChars(s) {
		return errors.New("must be 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'")
	}
	return nil
}

// checkName accepts pool names and label keys: 1..63 letters, digits, '.',
// '_', '-' and '/', starting with a letter or digit.
func checkName(s string) error {
	if s == "" || len(s) > maxNameLen || !badinput.Alnum(s[0]) || !isNameChars(s) {
		return errors.New("must be 1 to 63 letters, digits, '.', '_', '-' or '/', starting with a letter or digit")
	}
	return nil
}

func isNameChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; !badinput.Alnum(b) && b != '.' && b != '_' && b != '-' && b != '/' {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// decodeBody reads c's JSON body (bounded by QUARRY_MAX_JSON_BODY) strictly
// into v, as decodeStrict does.
func (g *Gateway) decodeBody(c *fiber.Ctx, v any, fields []string) error {
	bb, err := readBody(c, g.cfg.MaxJSONBody)
	if err != nil {
		return err
	}
	defer bytebufferpool.Put(bb)
	return decodeStrict(bb.B, v, fields)
}

// decodeStrict decodes a JSON object into v, refusing fields not in allowed
// and answering every problem as a *badinput.Error naming the
// field. An empty body is an empty object.
func decodeStrict(body []byte, v any, allowed []string) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return badinput.JSON(err)
	}
	var unknown []string
	for k := range fields {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return badinput.New(unknown[0], "unknown field (known: %s)", strings.Join(allowed, ", "))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badinput.JSON(err)
	}
	return nil
}

// queryInt returns query parameter name as a whole number between lo and
// hi, or def when it is absent. Anything else (not a number, out of range,
// too large to parse) is refused with the same message naming the range.
func queryInt(args *fasthttp.Args, name string, def, lo, hi int64) (int64, error) {
	s := args.Peek(name)
	if len(s) == 0 {
		return def, nil
	}
	n, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, badinput.New(name, "must be a whole number between %d and %d, got %q", lo, hi, s)
	}
	return n, nil
}

// labelFilter parses repeated label=k=v query values.
func labelFilter(vals [][]byte) (map[string]string, error) {
	var labels map[string]string
	for _, l := range vals {
		k, v, ok := bytes.Cut(l, []byte("="))
		if !ok || checkName(string(k)) != nil {
			return nil, badinput.New("label", "must be key=value with a label key, got %q", l)
		}
		if labels == nil {
			labels = make(map[string]string)
		}
		labels[string(k)] = string(v)
	}
	return labels, nil
}
