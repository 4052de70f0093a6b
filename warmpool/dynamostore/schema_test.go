package dynamostore

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRenderLocalStackInit_CreatesEveryTable(t *testing.T) {
	extra := ExtraTable{Def: &dynamodb.CreateTableInput{TableName: ptr("relay"), BillingMode: types.BillingModePayPerRequest}, TTLAttribute: "ttl"}
	got, err := RenderLocalStackInit(Config{}, extra)
	require.NoError(t, err)
	for _, def := range tableDefs(Config{}.WithDefaults()) {
		assert.Contains(t, got, "create_table "+*def.TableName+" '")
	}
	assert.Contains(t, got, "create_table relay '")
	assert.Contains(t, got, "enable_ttl "+ttlTable(Config{}.WithDefaults())+" ttl\n")
	assert.Contains(t, got, "enable_ttl relay ttl\n")
	assert.Contains(t, got, `{"N":"8"}`, "the schema item records the shard count")

	_, err = RenderLocalStackInit(Config{Shards: -1})
	assert.Error(t, err)
}

func TestCLIJSON_CarriesEveryDefinedField(t *testing.T) {
	for _, def := range tableDefs(Config{}.WithDefaults()) {
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
	for _, def := range tableDefs(Config{}.WithDefaults()) {
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
