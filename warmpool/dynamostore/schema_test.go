package dynamostore

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the committed LocalStack init hook")

// hookPath is the committed LocalStack init hook, rendered with the
// default Config.
var hookPath = filepath.Join("..", "..", "localstack", "init", "ready.d", "10-quarry-tables.sh")

func TestRenderLocalStackInit_MatchesCommittedHook(t *testing.T) {
	got, err := RenderLocalStackInit(Config{})
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(hookPath), 0o755))
		require.NoError(t, os.WriteFile(hookPath, []byte(got), 0o755))
	}
	want, err := os.ReadFile(hookPath)
	require.NoError(t, err, "the hook is missing: go test ./warmpool/dynamostore -run TestRenderLocalStackInit -update")
	assert.Equal(t, string(want), got, "the committed hook differs from the table definitions: go test ./warmpool/dynamostore -run TestRenderLocalStackInit -update")
	fi, err := os.Stat(hookPath)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&0o100, "LocalStack runs only executable hooks")
}

func TestCLIJSON_CarriesEveryDefinedField(t *testing.T) {
	for _, def := range tableDefs(Config{}.withDefaults()) {
		t.Run(*def.TableName, func(t *testing.T) {
			js, err := cliJSON(def)
			require.NoError(t, err)
			var got struct {
				TableName              string
				BillingMode            string
				AttributeDefinitions   []struct{ AttributeName, AttributeType string }
				KeySchema              []struct{ AttributeName, KeyType string }
				GlobalSecondaryIndexes []struct {
					IndexName  string
					KeySchema  []struct{ AttributeName, KeyType string }
					Projection struct {
						ProjectionType   string
						NonKeyAttributes []string
					}
				}
			}
			require.NoError(t, json.Unmarshal([]byte(js), &got))
			assert.Equal(t, *def.TableName, got.TableName)
			assert.Equal(t, string(def.BillingMode), got.BillingMode)
			require.Len(t, got.AttributeDefinitions, len(def.AttributeDefinitions))
			for i, a := range def.AttributeDefinitions {
				assert.Equal(t, *a.AttributeName, got.AttributeDefinitions[i].AttributeName)
				assert.Equal(t, string(a.AttributeType), got.AttributeDefinitions[i].AttributeType)
			}
			require.Len(t, got.GlobalSecondaryIndexes, len(def.GlobalSecondaryIndexes))
			for i, g := range def.GlobalSecondaryIndexes {
				gg := got.GlobalSecondaryIndexes[i]
				assert.Equal(t, *g.IndexName, gg.IndexName)
				require.Len(t, gg.KeySchema, len(g.KeySchema))
				for j, k := range g.KeySchema {
					assert.Equal(t, *k.AttributeName, gg.KeySchema[j].AttributeName)
					assert.Equal(t, string(k.KeyType), gg.KeySchema[j].KeyType)
				}
				assert.Equal(t, string(g.Projection.ProjectionType), gg.Projection.ProjectionType)
				assert.Equal(t, g.Projection.NonKeyAttributes, gg.Projection.NonKeyAttributes)
			}
		})
	}
}

func TestTableDefs_EveryKeyAttributeIsDefined(t *testing.T) {
	for _, def := range tableDefs(Config{}.withDefaults()) {
		defined := map[string]bool{}
		for _, a := range def.AttributeDefinitions {
			defined[*a.AttributeName] = true
		}
		used := map[string]bool{*def.KeySchema[0].AttributeName: true}
		for _, g := range def.GlobalSecondaryIndexes {
			for _, k := range g.KeySchema {
				used[*k.AttributeName] = true
			}
		}
		assert.Equal(t, defined, used, "table %s: DynamoDB wants exactly the key attributes defined", *def.TableName)
	}
}
