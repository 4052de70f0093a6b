package gateway

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// jsonFieldNames returns the JSON names of a struct type's fields, sorted.
func jsonFieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// The agent's bodies pass through the gateway unchanged: each schema of
// openapi.json that documents one lists exactly its fields.
func TestOpenAPI_AgentSchemasListEveryField(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(openAPI, &doc))
	for name, v := range map[string]any{
		"ExecRequest":          agentapi.ExecRequest{},
		"ExecResult":           agentapi.ExecResult{},
		"SessionCreateRequest": agentapi.SessionCreateRequest{},
		"SessionInfo":          agentapi.SessionInfo{},
		"SessionRunRequest":    agentapi.SessionRunRequest{},
		"SessionRunResult":     agentapi.SessionRunResult{},
		"ProcessStartRequest":  agentapi.ProcessStartRequest{},
		"ProcessInfo":          agentapi.ProcessInfo{},
		"ProcessOutput":        agentapi.ProcessOutput{},
		"ProcessCallRequest":   agentapi.ProcessCallRequest{},
		"ProcessCallResult":    agentapi.ProcessCallResult{},
		"SignalRequest":        agentapi.SignalRequest{},
		"FileInfo":             agentapi.FileInfo{},
		"FileList":             agentapi.FileList{},
		"WriteResult":          agentapi.WriteResult{},
		"KillAllResult":        agentapi.KillAllResult{},
	} {
		t.Run(name, func(t *testing.T) {
			s, ok := doc.Components.Schemas[name]
			require.True(t, ok, "schema %s is missing", name)
			var documented []string
			for p := range s.Properties {
				documented = append(documented, p)
			}
			sort.Strings(documented)
			assert.Equal(t, jsonFieldNames(reflect.TypeOf(v)), documented)
		})
	}
}
