package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/hashicorp/terraform-config-inspect/tfconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	"github.com/zclconf/go-cty/cty/gocty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/quarryhq/quarry/checkpoints/s3store"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/ecs"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// moduleDirs are the Terraform configurations checked here.
var moduleDirs = []string{"modules/quarry", "examples/basic"}

func tfFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no .tf files in %s", dir)
	return files
}

func TestModule_ParsesAndIsFormatted(t *testing.T) {
	for _, dir := range moduleDirs {
		for _, file := range tfFiles(t, dir) {
			t.Run(file, func(t *testing.T) {
				src, err := os.ReadFile(file)
				require.NoError(t, err)
				_, diags := hclparse.NewParser().ParseHCL(src, file)
				require.False(t, diags.HasErrors(), "parse: %s", diags.Error())
				assert.Equal(t, string(hclwrite.Format(src)), string(src), "not formatted as `terraform fmt` would")
			})
		}
	}
}

func TestModule_LoadsWithEveryVariableAndOutputDescribed(t *testing.T) {
	for _, dir := range moduleDirs {
		t.Run(dir, func(t *testing.T) {
			mod, diags := tfconfig.LoadModule(dir)
			require.Empty(t, diags, "load module: %v", diags)
			require.NotEmpty(t, mod.Variables)
			for name, v := range mod.Variables {
				assert.NotEmpty(t, strings.TrimSpace(v.Description), "variable %q has no description", name)
				assert.NotEmpty(t, v.Type, "variable %q has no type", name)
			}
			for name, o := range mod.Outputs {
				assert.NotEmpty(t, strings.TrimSpace(o.Description), "output %q has no description", name)
			}
		})
	}
	mod, diags := tfconfig.LoadModule("examples/basic")
	require.Empty(t, diags)
	require.Contains(t, mod.ModuleCalls, "quarry")
	assert.Equal(t, "../../modules/quarry", mod.ModuleCalls["quarry"].Source)
}

// table is a DynamoDB table's schema in comparable form.
type table struct {
	Name        string
	BillingMode string
	HashKey     string
	RangeKey    string
	Attributes  map[string]string // name -> S/N/B
	Indexes     map[string]index
	TTL         string // the TTL attribute, "" when TTL is off
}

type index struct {
	HashKey, RangeKey, Projection string
	NonKey                        []string
}

// fromGo converts a definition of the Go stores.
func fromGo(def *dynamodb.CreateTableInput, ttl string) table {
	t := table{Name: aws.ToString(def.TableName), BillingMode: string(def.BillingMode),
		Attributes: map[string]string{}, Indexes: map[string]index{}, TTL: ttl}
	keys := func(ks []types.KeySchemaElement) (hash, rng string) {
		for _, k := range ks {
			if k.KeyType == types.KeyTypeHash {
				hash = aws.ToString(k.AttributeName)
			} else {
				rng = aws.ToString(k.AttributeName)
			}
		}
		return hash, rng
	}
	t.HashKey, t.RangeKey = keys(def.KeySchema)
	for _, a := range def.AttributeDefinitions {
		t.Attributes[aws.ToString(a.AttributeName)] = string(a.AttributeType)
	}
	for _, g := range def.GlobalSecondaryIndexes {
		ix := index{Projection: string(g.Projection.ProjectionType), NonKey: slices.Sorted(slices.Values(g.Projection.NonKeyAttributes))}
		ix.HashKey, ix.RangeKey = keys(g.KeySchema)
		t.Indexes[aws.ToString(g.IndexName)] = ix
	}
	return t
}

// evalContext resolves var.* to the module's defaults and offers the
// functions the checked expressions use.
func evalContext(t *testing.T) *hcl.EvalContext {
	t.Helper()
	mod, diags := tfconfig.LoadModule("modules/quarry")
	require.Empty(t, diags)
	vars := map[string]cty.Value{}
	for name, v := range mod.Variables {
		if v.Default == nil {
			continue
		}
		b, err := json.Marshal(v.Default)
		require.NoError(t, err, "variable %s", name)
		ty, err := ctyjson.ImpliedType(b)
		require.NoError(t, err, "variable %s", name)
		val, err := ctyjson.Unmarshal(b, ty)
		require.NoError(t, err, "variable %s", name)
		vars[name] = val
	}
	return &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)},
		Functions: map[string]function.Function{"jsonencode": stdlib.JSONEncodeFunc, "merge": stdlib.MergeFunc, "tostring": toString},
	}
}

// toString is Terraform's tostring: a number or bool as a string.
var toString = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
	Type:   function.StaticReturnType(cty.String),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		return convert.Convert(args[0], cty.String)
	},
})

// blocks returns the module's top-level blocks, file by file.
func blocks(t *testing.T) []*hclsyntax.Block {
	t.Helper()
	var out []*hclsyntax.Block
	for _, file := range tfFiles(t, "modules/quarry") {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		f, diags := hclsyntax.ParseConfig(src, file, hcl.InitialPos)
		require.False(t, diags.HasErrors(), diags.Error())
		out = append(out, f.Body.(*hclsyntax.Body).Blocks...)
	}
	return out
}

// resources returns the module's resource blocks of a type by name.
func resources(t *testing.T, typ string) map[string]*hclsyntax.Block {
	t.Helper()
	out := map[string]*hclsyntax.Block{}
	for _, b := range blocks(t) {
		if b.Type == "resource" && len(b.Labels) == 2 && b.Labels[0] == typ {
			out[b.Labels[1]] = b
		}
	}
	return out
}

// str evaluates attribute name of body as a string ("" when absent).
func str(t *testing.T, ctx *hcl.EvalContext, body *hclsyntax.Body, name string) string {
	t.Helper()
	attr, ok := body.Attributes[name]
	if !ok {
		return ""
	}
	v, diags := attr.Expr.Value(ctx)
	require.False(t, diags.HasErrors(), "%s: %s", name, diags.Error())
	if v.Type() == cty.Bool {
		if v.True() {
			return "true"
		}
		return "false"
	}
	var s string
	require.NoError(t, gocty.FromCtyValue(v, &s), "%s", name)
	return s
}

// fromHCL reads an aws_dynamodb_table block.
func fromHCL(t *testing.T, ctx *hcl.EvalContext, b *hclsyntax.Block) table {
	t.Helper()
	body := b.Body
	tb := table{
		Name: str(t, ctx, body, "name"), BillingMode: str(t, ctx, body, "billing_mode"),
		HashKey: str(t, ctx, body, "hash_key"), RangeKey: str(t, ctx, body, "range_key"),
		Attributes: map[string]string{}, Indexes: map[string]index{},
	}
	for _, nb := range body.Blocks {
		switch nb.Type {
		case "attribute":
			tb.Attributes[str(t, ctx, nb.Body, "name")] = str(t, ctx, nb.Body, "type")
		case "global_secondary_index":
			ix := index{HashKey: str(t, ctx, nb.Body, "hash_key"), RangeKey: str(t, ctx, nb.Body, "range_key"),
				Projection: str(t, ctx, nb.Body, "projection_type")}
			if attr, ok := nb.Body.Attributes["non_key_attributes"]; ok {
				v, diags := attr.Expr.Value(ctx)
				require.False(t, diags.HasErrors(), diags.Error())
				list, err := convert.Convert(v, cty.List(cty.String))
				require.NoError(t, err)
				require.NoError(t, gocty.FromCtyValue(list, &ix.NonKey))
				sort.Strings(ix.NonKey)
			}
			tb.Indexes[str(t, ctx, nb.Body, "name")] = ix
		case "ttl":
			if str(t, ctx, nb.Body, "enabled") == "true" {
				tb.TTL = str(t, ctx, nb.Body, "attribute_name")
			}
		}
	}
	return tb
}

// The tables the module creates are the ones the gateway's stores create
// and query: same names (by default), keys, attribute types, indexes,
// projections and TTL attribute.
func TestModule_TablesMatchTheGoStores(t *testing.T) {
	ctx := evalContext(t)
	got := resources(t, "aws_dynamodb_table")
	storeCfg := dynamostore.Config{}
	defs := dynamostore.TableDefinitions(storeCfg)
	require.Len(t, defs, 2)
	ttlFor := func(name, ttlTable, attr string) string {
		if name == ttlTable {
			return attr
		}
		return ""
	}
	want := map[string]table{
		"tasks":       fromGo(defs[0], ttlFor(aws.ToString(defs[0].TableName), dynamostore.TTLTable(storeCfg), dynamostore.TTLAttribute)),
		"leases":      fromGo(defs[1], ttlFor(aws.ToString(defs[1].TableName), dynamostore.TTLTable(storeCfg), dynamostore.TTLAttribute)),
		"model_relay": fromGo(dynamobroker.TableDefinition(dynamobroker.DefaultTable), dynamobroker.TTLAttribute),
		"checkpoints": fromGo(s3store.TableDefinition(s3store.DefaultTable), ""),
	}
	require.Equal(t, slices.Sorted(maps(want)), slices.Sorted(maps(got)), "the module's tables")
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, w, fromHCL(t, ctx, got[name]))
		})
	}
}

// The checkpoint store's bucket aborts the multipart uploads a gateway
// that died mid-Put left (the store relies on it: docs/ARCHITECTURE.md),
// and the gateways get the bucket and the table the module made.
func TestModule_CheckpointBucketAbortsIncompleteUploads(t *testing.T) {
	require.Contains(t, resources(t, "aws_s3_bucket"), "checkpoints")
	lc := resources(t, "aws_s3_bucket_lifecycle_configuration")
	require.Contains(t, lc, "checkpoints")
	var abort *hclsyntax.Block
	for _, rule := range lc["checkpoints"].Body.Blocks {
		for _, b := range rule.Body.Blocks {
			if rule.Type == "rule" && b.Type == "abort_incomplete_multipart_upload" {
				abort = b
			}
		}
	}
	require.NotNil(t, abort, "a rule with abort_incomplete_multipart_upload")
	locals, err := os.ReadFile(filepath.Join("modules", "quarry", "locals.tf"))
	require.NoError(t, err)
	for _, want := range []string{
		`QUARRY_CHECKPOINT_STORE\s*=\s*"s3"\n`,
		`QUARRY_CHECKPOINT_BUCKET\s*=\s*aws_s3_bucket\.checkpoints\.id\n`,
		`QUARRY_CHECKPOINT_TABLE\s*=\s*aws_dynamodb_table\.checkpoints\.name\n`,
	} {
		assert.Regexp(t, want, string(locals))
	}
}

func maps[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// The schema item records the shard count the gateway is configured with,
// in the item CreateTables writes.
func TestModule_SchemaItemMatchesTheStore(t *testing.T) {
	ctx := evalContext(t)
	items := resources(t, "aws_dynamodb_table_item")
	require.Contains(t, items, "schema")
	v, diags := items["schema"].Body.Attributes["item"].Expr.Value(ctx)
	require.False(t, diags.HasErrors(), diags.Error())
	var got map[string]map[string]string
	require.NoError(t, json.Unmarshal([]byte(v.AsString()), &got))

	shards := ctx.Variables["var"].GetAttr("dynamodb_shards")
	var n int
	require.NoError(t, gocty.FromCtyValue(shards, &n))
	want := map[string]map[string]string{}
	for k, av := range dynamostore.SchemaItem(dynamostore.Config{Shards: n}) {
		switch av := av.(type) {
		case *types.AttributeValueMemberS:
			want[k] = map[string]string{"S": av.Value}
		case *types.AttributeValueMemberN:
			want[k] = map[string]string{"N": av.Value}
		default:
			require.Failf(t, "unexpected attribute type", "%s: %T", k, av)
		}
	}
	assert.Equal(t, want, got)
}

// Every QUARRY_* variable the module sets is one the docs describe: a
// renamed variable fails here rather than in a deployment.
func TestModule_SetsOnlyDocumentedVariables(t *testing.T) {
	var docs strings.Builder
	for _, name := range []string{"CONFIG.md", "ECS.md", "DEPLOY.md", "MODELSERVICE.md"} {
		b, err := os.ReadFile(filepath.Join("..", "docs", name))
		if err == nil {
			docs.Write(b)
		}
	}
	pattern := regexp.MustCompile(`\bQUARRY_[A-Z0-9_]*[A-Z0-9]\b`)
	seen := map[string]bool{}
	for _, file := range tfFiles(t, "modules/quarry") {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, name := range pattern.FindAllString(string(src), -1) {
			if seen[name] {
				continue
			}
			seen[name] = true
			assert.True(t, strings.Contains(docs.String(), name), "%s sets %s, which no doc describes", file, name)
		}
	}
	assert.NotEmpty(t, seen)
}

// The task events rule matches what the ECS provider reads: the cluster's
// "ECS Task State Change" events from aws.ecs (docs/ECS.md, "Events"),
// into a queue only that rule may send to and the gateway reads.
func TestModule_TaskEventsRouteMatchesTheProvider(t *testing.T) {
	ctx := evalContext(t)
	const clusterARN = "arn:aws:ecs:us-east-1:123456789012:cluster/quarry"
	ctx.Variables["aws_ecs_cluster"] = cty.ObjectVal(map[string]cty.Value{"this": cty.ObjectVal(map[string]cty.Value{"arn": cty.StringVal(clusterARN)})})
	rules := resources(t, "aws_cloudwatch_event_rule")
	require.Contains(t, rules, "task_events")
	var pattern struct {
		Source     []string `json:"source"`
		DetailType []string `json:"detail-type"`
		Detail     struct {
			ClusterArn []string `json:"clusterArn"`
		} `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(str(t, ctx, rules["task_events"].Body, "event_pattern")), &pattern))
	assert.Equal(t, []string{"aws.ecs"}, pattern.Source)
	assert.Equal(t, []string{"ECS Task State Change"}, pattern.DetailType)
	assert.Equal(t, []string{clusterARN}, pattern.Detail.ClusterArn)

	queues := resources(t, "aws_sqs_queue")
	require.Contains(t, queues, "task_events")
	wait := queues["task_events"].Body.Attributes["receive_wait_time_seconds"]
	require.NotNil(t, wait)
	v, diags := wait.Expr.Value(ctx)
	require.False(t, diags.HasErrors())
	assert.True(t, v.Equals(cty.NumberIntVal(20)).True(), "long polls, as the provider makes them: %#v", v)
	assert.Contains(t, resources(t, "aws_sqs_queue_policy"), "task_events")
	assert.Contains(t, resources(t, "aws_cloudwatch_event_target"), "task_events")

	iam, err := os.ReadFile("modules/quarry/iam.tf")
	require.NoError(t, err)
	assert.Regexp(t, `(?s)sid\s*=\s*"ReadTaskStateEvents".*"sqs:ReceiveMessage", "sqs:DeleteMessage".*aws_sqs_queue\.task_events\[0\]\.arn`, string(iam),
		"the gateway may receive and delete the queue's messages")
	locals, err := os.ReadFile("modules/quarry/locals.tf")
	require.NoError(t, err)
	assert.Regexp(t, `QUARRY_ECS_EVENTS_QUEUE_URL\s*=\s*aws_sqs_queue\.task_events\[0\]\.url`, string(locals))
}

// localExpr returns the expression of local name in the module.
func localExpr(t *testing.T, name string) hclsyntax.Expression {
	t.Helper()
	for _, b := range blocks(t) {
		if a, ok := b.Body.Attributes[name]; ok && b.Type == "locals" {
			return a.Expr
		}
	}
	require.Failf(t, "no such local", "local.%s", name)
	return nil
}

// The gateway registers task definitions (images on demand) only in
// families of its own prefix, which the ECS provider accepts and renders,
// and which Terraform's pool task definitions never start with; IAM lets
// it register, tag at registration, deregister and run those only, and the
// module tells the gateway the prefix and what to render with.
func TestModule_GatewayRegistersOnlyItsOwnFamilies(t *testing.T) {
	ctx := evalContext(t)
	v, diags := localExpr(t, "family_prefix").Value(ctx)
	require.False(t, diags.HasErrors(), diags.Error())
	prefix := v.AsString()
	assert.Equal(t, "quarry_", prefix, "with the default name")

	cfg := ecs.Config{Cluster: "quarry", Subnets: []string{"subnet-0123456789abcdef0"}, TokenKey: []byte(strings.Repeat("k", 32)),
		TokenKeySecretARN: "arn:aws:secretsmanager:us-east-1:123456789012:secret:k", ExecutionRoleARN: "arn:aws:iam::123456789012:role/x",
		AgentImage: "agent:1", FamilyPrefix: prefix}
	td, err := ecs.RenderTaskDefinition(cfg, providers.Spec{Pool: "i-abcdefghijklmnopqrstuvwx", Image: "python:3.11", Class: "default"})
	require.NoError(t, err, "the provider takes the module's prefix")
	family := aws.ToString(td.Family)
	assert.True(t, strings.HasPrefix(family, prefix), family)
	for _, pool := range []string{"default", "spot", "i-x", "quarry"} { // pool names are [a-z0-9-]: no '_'
		assert.False(t, strings.HasPrefix("quarry-"+pool, prefix), "Terraform's task definition of pool %s (\"<name>-<pool>\") is not the gateway's to deregister", pool)
	}

	iam, err := os.ReadFile("modules/quarry/iam.tf")
	require.NoError(t, err)
	for _, want := range []string{
		`own_task_definitions = "arn:\$\{local\.partition\}:ecs:\$\{local\.region\}:\$\{local\.account\}:task-definition/\$\{local\.family_prefix\}\*"`,
		`(?s)sid\s*=\s*"RegisterAndDeregisterItsOwnTaskDefinitions"\s*actions\s*=\s*\["ecs:RegisterTaskDefinition", "ecs:DeregisterTaskDefinition"\]\s*resources\s*=\s*\[local\.own_task_definitions\]`,
		`(?s)sid\s*=\s*"TagItsTaskDefinitionsAtRegistration"\s*actions\s*=\s*\["ecs:TagResource"\]\s*resources\s*=\s*\[local\.own_task_definitions\]\s*condition \{\s*test\s*=\s*"StringEquals"\s*variable\s*=\s*"ecs:CreateAction"\s*values\s*=\s*\["RegisterTaskDefinition"\]`,
		`(?s)sid\s*=\s*"RunPoolTasksOnThisCluster".*var\.on_demand_images \? \[local\.own_task_definitions\]`,
		`(?s)sid\s*=\s*"PassOnlyTheSandboxRoles"\s*actions\s*=\s*\["iam:PassRole"\]\s*resources\s*=\s*local\.passed_roles`,
	} {
		assert.Regexp(t, want, string(iam))
	}
	assert.NotRegexp(t, `"ecs:(Register|Deregister)TaskDefinition"[^\]]*\]\s*resources\s*=\s*\["\*"\]`, string(iam), "never on every family")
	locals, err := os.ReadFile("modules/quarry/locals.tf")
	require.NoError(t, err)
	for _, want := range []string{
		`QUARRY_ECS_FAMILY_PREFIX\s*=\s*local\.family_prefix`,
		`QUARRY_ECS_EXECUTION_ROLE_ARN\s*=\s*aws_iam_role\.sandbox_execution\.arn`,
		`QUARRY_ECS_AGENT_IMAGE\s*=\s*var\.agent_image`,
	} {
		assert.Regexp(t, want, string(locals))
	}
	onDemand := ctx.Variables["var"].GetAttr("on_demand_images")
	assert.True(t, onDemand.True(), "on by default: any allowed image works")
}

// The ECR pull-through cache is optional (no rule by default), one rule per
// prefix the user names, and the sandboxes' execution role may create and
// fill repositories under those prefixes only.
func TestModule_PullThroughCacheIsOptional(t *testing.T) {
	ctx := evalContext(t)
	rules := ctx.Variables["var"].GetAttr("pull_through_cache_rules")
	assert.Zero(t, rules.LengthInt(), "none by default")

	got := resources(t, "aws_ecr_pull_through_cache_rule")
	require.Contains(t, got, "this")
	forEach := got["this"].Body.Attributes["for_each"]
	require.NotNil(t, forEach)
	assert.Equal(t, "var.pull_through_cache_rules", exprText(t, forEach))

	ecr, err := os.ReadFile("modules/quarry/ecr.tf")
	require.NoError(t, err)
	assert.Regexp(t, `(?s)actions\s*=\s*\["ecr:CreateRepository", "ecr:BatchImportUpstreamImage"\].*repository/\$\{prefix\}/\*`, string(ecr))
	assert.Regexp(t, `count\s*=\s*length\(var\.pull_through_cache_rules\) > 0 \? 1 : 0`, string(ecr), "no policy without a rule")
	policies := resources(t, "aws_iam_role_policy")
	require.Contains(t, policies, "sandbox_execution_pull_through")
	assert.Equal(t, "aws_iam_role.sandbox_execution.id", exprText(t, policies["sandbox_execution_pull_through"].Body.Attributes["role"]))
}

// exprText returns the source of an attribute's expression.
func exprText(t *testing.T, a *hclsyntax.Attribute) string {
	t.Helper()
	r := a.Expr.Range()
	src, err := os.ReadFile(r.Filename)
	require.NoError(t, err)
	return string(r.SliceBytes(src))
}
