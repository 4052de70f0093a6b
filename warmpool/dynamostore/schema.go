package dynamostore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// tablePoll is how often CreateTables and DeleteTables look at a table
// they wait for.
const tablePoll = 500 * time.Millisecond

// tableDefs returns the definitions of both tables: the only source of
// their schema, used by CreateTables and by the rendered LocalStack hook.
func tableDefs(cfg Config) []*dynamodb.CreateTableInput {
	attr := func(name string, t types.ScalarAttributeType) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: ptr(name), AttributeType: t}
	}
	keys := func(hash, rng string) []types.KeySchemaElement {
		ks := []types.KeySchemaElement{{AttributeName: ptr(hash), KeyType: types.KeyTypeHash}}
		if rng != "" {
			ks = append(ks, types.KeySchemaElement{AttributeName: ptr(rng), KeyType: types.KeyTypeRange})
		}
		return ks
	}
	gsi := func(name, hash, rng string, p types.ProjectionType, include ...string) types.GlobalSecondaryIndex {
		return types.GlobalSecondaryIndex{IndexName: ptr(name), KeySchema: keys(hash, rng),
			Projection: &types.Projection{ProjectionType: p, NonKeyAttributes: include}}
	}
	return []*dynamodb.CreateTableInput{
		{
			TableName:   ptr(cfg.TasksTable),
			BillingMode: types.BillingModePayPerRequest,
			AttributeDefinitions: []types.AttributeDefinition{
				attr(attrPK, types.ScalarAttributeTypeS), attr(attrPoolPK, types.ScalarAttributeTypeS),
				attr(attrReadyPK, types.ScalarAttributeTypeS), attr(attrReadySK, types.ScalarAttributeTypeN),
			},
			KeySchema: keys(attrPK, ""),
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
				gsi(indexTasksByPool, attrPoolPK, "", types.ProjectionTypeKeysOnly),
				gsi(indexReady, attrReadyPK, attrReadySK, types.ProjectionTypeAll),
			},
		},
		{
			TableName:   ptr(cfg.LeasesTable),
			BillingMode: types.BillingModePayPerRequest,
			AttributeDefinitions: []types.AttributeDefinition{
				attr(attrPK, types.ScalarAttributeTypeS),
				attr(attrOwnerPK, types.ScalarAttributeTypeS), attr(attrOwnerSK, types.ScalarAttributeTypeN),
				attr(attrExpiryPK, types.ScalarAttributeTypeS), attr(attrExpirySK, types.ScalarAttributeTypeN),
				attr(attrEndedPK, types.ScalarAttributeTypeS), attr(attrEndedSK, types.ScalarAttributeTypeN),
			},
			KeySchema: keys(attrPK, ""),
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
				gsi(indexByOwner, attrOwnerPK, attrOwnerSK, types.ProjectionTypeKeysOnly),
				gsi(indexByExpiry, attrExpiryPK, attrExpirySK, types.ProjectionTypeKeysOnly),
				gsi(indexByEnd, attrEndedPK, attrEndedSK, types.ProjectionTypeInclude, fOwner, fIdemKey, fIdemForgotten),
			},
		},
	}
}

// ttlTable is the table whose items carry the TTL attribute (ended leases,
// their idempotency keys, locks).
func ttlTable(cfg Config) string { return cfg.LeasesTable }

// schemaItem records cfg.Shards in the tasks table.
func schemaItem(cfg Config) item {
	return item{attrPK: avS(schemaPK), attrShards: avN(int64(cfg.Shards))}
}

// CreateTables creates both tables (on-demand capacity) with their
// indexes, waits until they and their indexes are ACTIVE (at most
// cfg.TableWait), enables TTL on the leases table and records cfg.Shards.
// It is idempotent: existing tables are checked, not changed. It fails when
// an existing table lacks an index, or was made with another Shards value.
func CreateTables(ctx context.Context, api API, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.TableWait)
	defer cancel()
	for _, def := range tableDefs(cfg) {
		_, err := api.CreateTable(ctx, def)
		var inUse *types.ResourceInUseException
		if err != nil && !errors.As(err, &inUse) {
			return translate("create table "+*def.TableName, err)
		}
		if err := waitActive(ctx, api, def); err != nil {
			return err
		}
	}
	if err := enableTTL(ctx, api, ttlTable(cfg)); err != nil {
		return err
	}
	e := newExpr()
	cond := "attribute_not_exists(" + e.n(attrPK) + ") OR " + e.n(attrShards) + " = " + e.v(avN(int64(cfg.Shards)))
	_, err := api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: ptr(cfg.TasksTable), Item: schemaItem(cfg), ConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := isConditionFailed(err); ok {
		d := decoder{it: old}
		return fmt.Errorf("create tables: %s was created with QUARRY_DYNAMODB_SHARDS=%d, not %d; the shard count cannot change on existing tables",
			cfg.TasksTable, d.n(attrShards), cfg.Shards)
	}
	return translate("record the schema in "+cfg.TasksTable, err)
}

// waitActive waits until def's table and all its indexes are ACTIVE, and
// checks that the table has def's key and indexes.
func waitActive(ctx context.Context, api API, def *dynamodb.CreateTableInput) error {
	name := *def.TableName
	for {
		out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &name})
		if err != nil {
			return translate("describe table "+name, err)
		}
		if err := checkSchema(def, out.Table); err != nil {
			return err
		}
		if tableActive(out.Table) {
			return nil
		}
		if err := sleep(ctx, tablePoll); err != nil {
			return fmt.Errorf("wait for table %s to become active: %w", name, err)
		}
	}
}

func tableActive(t *types.TableDescription) bool {
	if t == nil || t.TableStatus != types.TableStatusActive {
		return false
	}
	for _, g := range t.GlobalSecondaryIndexes {
		if g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}

// checkSchema reports how an existing table differs from def (its key and
// its indexes' keys and projections).
func checkSchema(def *dynamodb.CreateTableInput, t *types.TableDescription) error {
	name := *def.TableName
	if t == nil {
		return fmt.Errorf("table %s: DescribeTable returned no description", name)
	}
	if !sameKeys(def.KeySchema, t.KeySchema) {
		return fmt.Errorf("table %s exists with another key schema; delete it or use another QUARRY_DYNAMODB_*_TABLE", name)
	}
	for _, want := range def.GlobalSecondaryIndexes {
		i := slices.IndexFunc(t.GlobalSecondaryIndexes, func(g types.GlobalSecondaryIndexDescription) bool {
			return g.IndexName != nil && *g.IndexName == *want.IndexName
		})
		if i < 0 {
			return fmt.Errorf("table %s exists without index %s; delete the table or add the index", name, *want.IndexName)
		}
		got := t.GlobalSecondaryIndexes[i]
		if !sameKeys(want.KeySchema, got.KeySchema) || got.Projection == nil || got.Projection.ProjectionType != want.Projection.ProjectionType {
			return fmt.Errorf("table %s: index %s has another key schema or projection; delete the table or fix the index", name, *want.IndexName)
		}
	}
	return nil
}

func sameKeys(a, b []types.KeySchemaElement) bool {
	return slices.EqualFunc(a, b, func(x, y types.KeySchemaElement) bool {
		return x.AttributeName != nil && y.AttributeName != nil && *x.AttributeName == *y.AttributeName && x.KeyType == y.KeyType
	})
}

// enableTTL turns TTL on for table's attrTTL unless it is on already
// (DynamoDB refuses to enable it twice).
func enableTTL(ctx context.Context, api API, table string) error {
	out, err := api.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: &table})
	if err != nil {
		return translate("describe TTL of "+table, err)
	}
	if d := out.TimeToLiveDescription; d != nil && d.AttributeName != nil && *d.AttributeName == attrTTL &&
		(d.TimeToLiveStatus == types.TimeToLiveStatusEnabled || d.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{TableName: &table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: ptr(attrTTL), Enabled: ref(true)}})
	return translate("enable TTL on "+table, err)
}

func ref[T any](v T) *T { return &v }

// DeleteTables deletes both tables and waits until they are gone (at most
// cfg.TableWait). It is idempotent: a missing table is not an error.
func DeleteTables(ctx context.Context, api API, cfg Config) error {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(ctx, cfg.TableWait)
	defer cancel()
	for _, def := range tableDefs(cfg) {
		name := *def.TableName
		for {
			_, err := api.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &name})
			var inUse *types.ResourceInUseException
			if errors.As(err, &inUse) { // being created or updated: wait, then delete
				if err := sleep(ctx, tablePoll); err != nil {
					return fmt.Errorf("delete table %s: %w", name, err)
				}
				continue
			}
			if err != nil && !isTableMissing(err) {
				return translate("delete table "+name, err)
			}
			break
		}
		for {
			_, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &name})
			if isTableMissing(err) {
				break
			}
			if err != nil {
				return translate("describe table "+name, err)
			}
			if err := sleep(ctx, tablePoll); err != nil {
				return fmt.Errorf("wait for table %s to go: %w", name, err)
			}
		}
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ExtraTable is another component's table for RenderLocalStackInit (the
// model relay's): its definition and its TTL attribute ("" for none).
type ExtraTable struct {
	Def          *dynamodb.CreateTableInput
	TTLAttribute string
}

// RenderLocalStackInit returns the LocalStack init hook (a bash script for
// /etc/localstack/init/ready.d/) that creates cfg's tables, and extra's,
// with awslocal exactly as CreateTables does: the same definitions,
// rendered as the CLI's --cli-input-json, TTL enabled, the schema item
// written. localstack/init/ready.d/10-quarry-tables.sh holds it rendered
// with the default Config and the relay's table (`quarry tables
// localstack-hook`); a unit test in cmd/quarry fails when the two differ.
func RenderLocalStackInit(cfg Config, extra ...ExtraTable) (string, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return "", fmt.Errorf("render LocalStack init: %w", err)
	}
	var b bytes.Buffer
	b.WriteString(`#!/usr/bin/env bash
# Creates Quarry's DynamoDB tables in LocalStack (run from /etc/localstack/init/ready.d/).
# Generated from the Go table definitions (warmpool/dynamostore, modelservice/dynamobroker);
# do not edit: go test ./cmd/quarry -run TestLocalStackHook -update rewrites it.
set -euo pipefail

create_table() { # name cli-input-json
  if awslocal dynamodb describe-table --table-name "$1" >/dev/null 2>&1; then
    echo "quarry: table $1 exists"
    return
  fi
  awslocal dynamodb create-table --cli-input-json "$2" >/dev/null
  awslocal dynamodb wait table-exists --table-name "$1"
  echo "quarry: created table $1"
}

enable_ttl() { # table attribute
  if [ "$(awslocal dynamodb describe-time-to-live --table-name "$1" --query TimeToLiveDescription.TimeToLiveStatus --output text)" != ENABLED ]; then
    awslocal dynamodb update-time-to-live --table-name "$1" --time-to-live-specification "Enabled=true,AttributeName=$2" >/dev/null
  fi
}

`)
	tables := []ExtraTable{}
	for _, def := range tableDefs(cfg) {
		ttl := ""
		if *def.TableName == ttlTable(cfg) {
			ttl = attrTTL
		}
		tables = append(tables, ExtraTable{Def: def, TTLAttribute: ttl})
	}
	tables = append(tables, extra...)
	for _, t := range tables {
		js, err := cliJSON(t.Def)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "create_table %s '%s'\n", *t.Def.TableName, js)
	}
	b.WriteString("\n")
	for _, t := range tables {
		if t.TTLAttribute != "" {
			fmt.Fprintf(&b, "enable_ttl %s %s\n", *t.Def.TableName, t.TTLAttribute)
		}
	}
	fmt.Fprintf(&b, `awslocal dynamodb put-item --table-name %s \
  --item '{"%s":{"S":"%s"},"%s":{"N":"%d"}}' \
  --condition-expression 'attribute_not_exists(%s) OR %s = :n' \
  --expression-attribute-values '{":n":{"N":"%d"}}'
echo "quarry: tables ready (%d shards)"
`, cfg.TasksTable, attrPK, schemaPK, attrShards, cfg.Shards, attrPK, attrShards, cfg.Shards, cfg.Shards)
	return b.String(), nil
}

// cliJSON renders the fields of a CreateTableInput that tableDefs sets in
// the AWS CLI's --cli-input-json shape (the API's own field names).
func cliJSON(in *dynamodb.CreateTableInput) (string, error) {
	type kv = map[string]any
	keys := func(ks []types.KeySchemaElement) []kv {
		var out []kv
		for _, k := range ks {
			out = append(out, kv{"AttributeName": *k.AttributeName, "KeyType": string(k.KeyType)})
		}
		return out
	}
	var attrs []kv
	for _, a := range in.AttributeDefinitions {
		attrs = append(attrs, kv{"AttributeName": *a.AttributeName, "AttributeType": string(a.AttributeType)})
	}
	var gsis []kv
	for _, g := range in.GlobalSecondaryIndexes {
		p := kv{"ProjectionType": string(g.Projection.ProjectionType)}
		if len(g.Projection.NonKeyAttributes) > 0 {
			p["NonKeyAttributes"] = g.Projection.NonKeyAttributes
		}
		gsis = append(gsis, kv{"IndexName": *g.IndexName, "KeySchema": keys(g.KeySchema), "Projection": p})
	}
	out := kv{"TableName": *in.TableName, "BillingMode": string(in.BillingMode), "AttributeDefinitions": attrs,
		"KeySchema": keys(in.KeySchema), "GlobalSecondaryIndexes": gsis}
	js, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("render table %s: %w", *in.TableName, err)
	}
	return string(js), nil
}

// TTLAttribute is the attribute whose epoch seconds DynamoDB's TTL reads on
// the TTLTable (ended leases, their idempotency keys, locks).
const TTLAttribute = attrTTL

// TableDefinitions returns the definitions CreateTables creates for cfg
// (defaults applied): key schemas, attribute types, global secondary
// indexes and their projections. It is for tools that create the tables
// another way (the Terraform module in infra/ is checked against it) and
// must not be modified by them.
func TableDefinitions(cfg Config) []*dynamodb.CreateTableInput {
	return tableDefs(cfg.WithDefaults())
}

// TTLTable returns the name of the table on which CreateTables enables TTL
// on TTLAttribute (defaults applied).
func TTLTable(cfg Config) string { return ttlTable(cfg.WithDefaults()) }

// SchemaItem returns the item CreateTables records in the tasks table:
// the shard count the tables were made with (defaults applied). A table
// created another way must hold it too.
func SchemaItem(cfg Config) map[string]types.AttributeValue {
	return schemaItem(cfg.WithDefaults())
}
