package ddbsim

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Billing modes.
const (
	billingOnDemand    = "PAY_PER_REQUEST"
	billingProvisioned = "PROVISIONED"
)

// maxGSIs is DynamoDB's limit of global secondary indexes per table.
const maxGSIs = 20

var tableNameRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

type keySchemaElem struct {
	AttributeName string
	KeyType       string
}

type projectionIn struct {
	ProjectionType   string
	NonKeyAttributes []string `json:",omitempty"`
}

type throughputIn struct {
	ReadCapacityUnits  int64
	WriteCapacityUnits int64
}

type onDemandIn struct {
	MaxReadRequestUnits  int64 `json:",omitempty"`
	MaxWriteRequestUnits int64 `json:",omitempty"`
}

type gsiIn struct {
	IndexName             string
	KeySchema             []keySchemaElem
	Projection            projectionIn
	ProvisionedThroughput *throughputIn
	OnDemandThroughput    *onDemandIn
	WarmThroughput        json.RawMessage
}

type createTableIn struct {
	TableName              string
	AttributeDefinitions   []attrDef
	KeySchema              []keySchemaElem
	GlobalSecondaryIndexes []gsiIn
	LocalSecondaryIndexes  json.RawMessage
	BillingMode            string
	ProvisionedThroughput  *throughputIn
	OnDemandThroughput     *onDemandIn
	StreamSpecification    *struct {
		StreamEnabled  bool
		StreamViewType string
	}
	SSESpecification          json.RawMessage
	Tags                      []tag
	TableClass                string
	DeletionProtectionEnabled bool
	WarmThroughput            json.RawMessage
	ResourcePolicy            string
}

// table returns the active table name (catching its indexes up to now);
// ResourceNotFoundException when there is none.
func (s *Server) table(name string, now time.Time) (*table, *apiError) {
	if name == "" {
		return nil, validation("1 validation error detected: Value null at 'tableName' failed to satisfy constraint: Member must not be null")
	}
	t := s.tables[name]
	if t == nil || t.status(now) != statusActive {
		return nil, notFound("Requested resource not found")
	}
	t.catchUp(now)
	return t, nil
}

func (s *Server) arn(kind, name string) string {
	return fmt.Sprintf("arn:aws:dynamodb:%s:%s:%s/%s", s.cfg.Region, s.cfg.AccountID, kind, name)
}

func (s *Server) createTable(body []byte) (any, *apiError) {
	var in createTableIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if !tableNameRE.MatchString(in.TableName) {
		return nil, validation("1 validation error detected: Value '%s' at 'tableName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9_.-]+ and have length between 3 and 255", in.TableName)
	}
	if len(in.LocalSecondaryIndexes) > 0 && string(in.LocalSecondaryIndexes) != "null" {
		return nil, validation("ddbsim (a simulator of DynamoDB) does not simulate local secondary indexes")
	}
	if in.StreamSpecification != nil && in.StreamSpecification.StreamEnabled {
		return nil, validation("ddbsim (a simulator of DynamoDB) does not simulate streams")
	}
	types := map[string]string{}
	for _, d := range in.AttributeDefinitions {
		if d.AttributeType != typeS && d.AttributeType != typeN && d.AttributeType != typeB {
			return nil, validation("1 validation error detected: Value '%s' at 'attributeDefinitions.member.attributeType' failed to satisfy constraint: Member must satisfy enum value set: [B, N, S]", d.AttributeType)
		}
		if _, dup := types[d.AttributeName]; dup {
			return nil, validation("Cannot have two attributes with the same name")
		}
		types[d.AttributeName] = d.AttributeType
	}
	used := map[string]bool{}
	ks, err := schemaOf(in.KeySchema, types, used, "")
	if err != nil {
		return nil, err
	}
	t := &table{
		name: in.TableName, arn: s.arn("table", in.TableName), ks: ks, attrDefs: in.AttributeDefinitions,
		billing: in.BillingMode, tags: in.Tags, items: map[string]*row{}, data: newOrdered(),
	}
	if t.billing == "" {
		t.billing = billingProvisioned
	}
	switch t.billing {
	case billingOnDemand:
		if in.ProvisionedThroughput != nil {
			return nil, validation("One or more parameter values were invalid: Neither ReadCapacityUnits nor WriteCapacityUnits can be specified when BillingMode is PAY_PER_REQUEST")
		}
		if o := in.OnDemandThroughput; o != nil {
			t.maxRead, t.maxWrite = float64(o.MaxReadRequestUnits), float64(o.MaxWriteRequestUnits)
		}
	case billingProvisioned:
		p := in.ProvisionedThroughput
		if p == nil || p.ReadCapacityUnits < 1 || p.WriteCapacityUnits < 1 {
			return nil, validation("One or more parameter values were invalid: ReadCapacityUnits and WriteCapacityUnits must both be specified when BillingMode is PROVISIONED")
		}
		t.maxRead, t.maxWrite = float64(p.ReadCapacityUnits), float64(p.WriteCapacityUnits)
	default:
		return nil, validation("1 validation error detected: Value '%s' at 'billingMode' failed to satisfy constraint: Member must satisfy enum value set: [PROVISIONED, PAY_PER_REQUEST]", t.billing)
	}
	if len(in.GlobalSecondaryIndexes) > maxGSIs {
		return nil, validation("One or more parameter values were invalid: GlobalSecondaryIndexes count exceeds the per-table limit of %d", maxGSIs)
	}
	for _, g := range in.GlobalSecondaryIndexes {
		if !tableNameRE.MatchString(g.IndexName) {
			return nil, validation("1 validation error detected: Value '%s' at 'globalSecondaryIndexes.member.indexName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9_.-]+", g.IndexName)
		}
		if t.index(g.IndexName) != nil {
			return nil, validation("One or more parameter values were invalid: Duplicate index name: %s", g.IndexName)
		}
		iks, err := schemaOf(g.KeySchema, types, used, g.IndexName)
		if err != nil {
			return nil, err
		}
		ix := &index{name: g.IndexName, arn: t.arn + "/index/" + g.IndexName, ks: iks, projType: g.Projection.ProjectionType,
			include: g.Projection.NonKeyAttributes, data: newOrdered(), cur: map[string]indexed{}}
		switch ix.projType {
		case projAll, projKeysOnly:
			if len(ix.include) > 0 {
				return nil, validation("One or more parameter values were invalid: ProjectionType is %s, but NonKeyAttributes is specified", ix.projType)
			}
		case projInclude:
			if len(ix.include) == 0 {
				return nil, validation("One or more parameter values were invalid: ProjectionType is INCLUDE, but NonKeyAttributes is not specified")
			}
		default:
			return nil, validation("1 validation error detected: Value '%s' at 'globalSecondaryIndexes.member.projection.projectionType' failed to satisfy constraint: Member must satisfy enum value set: [ALL, INCLUDE, KEYS_ONLY]", ix.projType)
		}
		t.gsis = append(t.gsis, ix)
	}
	if len(used) != len(types) {
		return nil, validation("One or more parameter values were invalid: Number of attributes in KeySchema does not exactly match number of attributes defined in AttributeDefinitions")
	}
	var out any
	aerr := s.locked(func(now time.Time) *apiError {
		if _, ok := s.tables[in.TableName]; ok {
			return newError(codeResourceInUse, 400, "Table already exists: %s", in.TableName)
		}
		t.created = now
		t.activeAt = now.Add(s.cfg.TableCreateDelay)
		t.id = fmt.Sprintf("%08x-0000-4000-8000-%012x", now.UnixNano()&0xffffffff, len(s.tables))
		s.tables[in.TableName] = t
		d := s.describe(t, now)
		d.TableStatus = statusCreating
		out = map[string]any{"TableDescription": d}
		return nil
	})
	return out, aerr
}

// schemaOf checks a key schema (one HASH, then optionally one RANGE, both
// defined) and records its attributes in used.
func schemaOf(elems []keySchemaElem, types map[string]string, used map[string]bool, indexName string) (keySchema, *apiError) {
	var ks keySchema
	where := "table"
	if indexName != "" {
		where = "index " + indexName
	}
	if len(elems) == 0 || len(elems) > 2 || elems[0].KeyType != "HASH" || len(elems) == 2 && elems[1].KeyType != "RANGE" {
		return ks, validation("1 validation error detected: Invalid KeySchema for %s: the first element must be HASH and the optional second RANGE", where)
	}
	for i, e := range elems {
		t, ok := types[e.AttributeName]
		if !ok {
			return ks, validation("One or more parameter values were invalid: Some index key attributes are not defined in AttributeDefinitions. Keys: [%s], AttributeDefinitions: [%s]", e.AttributeName, definedNames(types))
		}
		used[e.AttributeName] = true
		if i == 0 {
			ks.hash = keyAttr{name: e.AttributeName, typ: t}
		} else {
			if e.AttributeName == ks.hash.name {
				return ks, validation("Both the Hash Key and the Range Key element in the KeySchema have the same name")
			}
			ks.rng = keyAttr{name: e.AttributeName, typ: t}
		}
	}
	return ks, nil
}

func definedNames(types map[string]string) string {
	names := make([]string, 0, len(types))
	for n := range types {
		names = append(names, n)
	}
	slices.Sort(names)
	out := ""
	for i, n := range names {
		if i > 0 {
			out += ", "
		}
		out += n
	}
	return out
}

type gsiDesc struct {
	IndexName             string
	IndexArn              string
	KeySchema             []keySchemaElem
	Projection            projectionIn
	IndexStatus           string
	ItemCount             int64
	IndexSizeBytes        int64
	ProvisionedThroughput throughputDesc
}

type throughputDesc struct {
	ReadCapacityUnits      int64
	WriteCapacityUnits     int64
	NumberOfDecreasesToday int64
}

type tableDesc struct {
	TableName                 string
	TableArn                  string
	TableId                   string
	TableStatus               string
	CreationDateTime          float64
	KeySchema                 []keySchemaElem
	AttributeDefinitions      []attrDef
	ItemCount                 int64
	TableSizeBytes            int64
	BillingModeSummary        *struct{ BillingMode string } `json:",omitempty"`
	ProvisionedThroughput     throughputDesc
	OnDemandThroughput        *onDemandIn `json:",omitempty"`
	GlobalSecondaryIndexes    []gsiDesc   `json:",omitempty"`
	DeletionProtectionEnabled bool
}

func schemaElems(ks keySchema) []keySchemaElem {
	out := []keySchemaElem{{AttributeName: ks.hash.name, KeyType: "HASH"}}
	if ks.hasRange() {
		out = append(out, keySchemaElem{AttributeName: ks.rng.name, KeyType: "RANGE"})
	}
	return out
}

func (s *Server) describe(t *table, now time.Time) tableDesc {
	d := tableDesc{
		TableName: t.name, TableArn: t.arn, TableId: t.id, TableStatus: t.status(now),
		CreationDateTime: float64(t.created.UnixMilli()) / 1000, KeySchema: schemaElems(t.ks), AttributeDefinitions: t.attrDefs,
		ItemCount: int64(t.data.count), TableSizeBytes: t.data.bytes,
	}
	if t.billing == billingOnDemand {
		d.BillingModeSummary = &struct{ BillingMode string }{BillingMode: billingOnDemand}
		if t.maxRead > 0 || t.maxWrite > 0 {
			d.OnDemandThroughput = &onDemandIn{MaxReadRequestUnits: int64(t.maxRead), MaxWriteRequestUnits: int64(t.maxWrite)}
		}
	} else {
		d.ProvisionedThroughput = throughputDesc{ReadCapacityUnits: int64(t.maxRead), WriteCapacityUnits: int64(t.maxWrite)}
	}
	for _, ix := range t.gsis {
		d.GlobalSecondaryIndexes = append(d.GlobalSecondaryIndexes, gsiDesc{
			IndexName: ix.name, IndexArn: ix.arn, KeySchema: schemaElems(ix.ks),
			Projection:  projectionIn{ProjectionType: ix.projType, NonKeyAttributes: ix.include},
			IndexStatus: t.status(now), ItemCount: int64(ix.data.count), IndexSizeBytes: ix.data.bytes,
		})
	}
	return d
}

type tableNameIn struct{ TableName string }

// onTable runs fn, under the mutex, on the table that a request of just
// a TableName names (in any state).
func (s *Server) onTable(body []byte, fn func(t *table, now time.Time) (any, *apiError)) (any, *apiError) {
	var in tableNameIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	var out any
	aerr := s.locked(func(now time.Time) *apiError {
		t := s.tables[in.TableName]
		if t == nil {
			return notFound("Requested resource not found: Table: %s not found", in.TableName)
		}
		t.catchUp(now)
		var err *apiError
		out, err = fn(t, now)
		return err
	})
	return out, aerr
}

func (s *Server) describeTable(body []byte) (any, *apiError) {
	return s.onTable(body, func(t *table, now time.Time) (any, *apiError) {
		return map[string]any{"Table": s.describe(t, now)}, nil
	})
}

func (s *Server) deleteTable(body []byte) (any, *apiError) {
	return s.onTable(body, func(t *table, now time.Time) (any, *apiError) {
		if t.status(now) == statusCreating {
			return nil, newError(codeResourceInUse, 400, "Attempt to change a resource which is still in use: Table is being created: %s", t.name)
		}
		d := s.describe(t, now)
		d.TableStatus = statusDeleting
		delete(s.tables, t.name)
		return map[string]any{"TableDescription": d}, nil
	})
}

type listTablesIn struct {
	ExclusiveStartTableName string
	Limit                   int
}

func (s *Server) listTables(body []byte) (any, *apiError) {
	var in listTablesIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if in.Limit == 0 {
		in.Limit = 100
	}
	if in.Limit < 1 || in.Limit > 100 {
		return nil, validation("1 validation error detected: Value '%d' at 'limit' failed to satisfy constraint: Member must have value less than or equal to 100", in.Limit)
	}
	var names []string
	_ = s.locked(func(time.Time) *apiError {
		for n := range s.tables {
			if n > in.ExclusiveStartTableName {
				names = append(names, n)
			}
		}
		return nil
	})
	slices.Sort(names)
	out := map[string]any{}
	if len(names) > in.Limit {
		names = names[:in.Limit]
		out["LastEvaluatedTableName"] = names[len(names)-1]
	}
	if names == nil {
		names = []string{}
	}
	out["TableNames"] = names
	return out, nil
}

type ttlSpec struct {
	AttributeName string
	Enabled       bool
}

type updateTTLIn struct {
	TableName               string
	TimeToLiveSpecification ttlSpec
}

func (s *Server) updateTTL(body []byte) (any, *apiError) {
	var in updateTTLIn
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	spec := in.TimeToLiveSpecification
	if spec.AttributeName == "" {
		return nil, validation("1 validation error detected: Value null at 'timeToLiveSpecification.attributeName' failed to satisfy constraint: Member must not be null")
	}
	aerr := s.locked(func(now time.Time) *apiError {
		t, err := s.table(in.TableName, now)
		if err != nil {
			return err
		}
		switch {
		case spec.Enabled && t.ttlOn && t.ttlAttr == spec.AttributeName:
			return validation("TimeToLive is already enabled")
		case spec.Enabled && t.ttlOn:
			return validation("TimeToLive is active on a different AttributeName: current AttributeName is %s", t.ttlAttr)
		case !spec.Enabled && !t.ttlOn:
			return validation("TimeToLive is already disabled")
		case !spec.Enabled && t.ttlAttr != spec.AttributeName:
			return validation("TimeToLive is active on a different AttributeName: current AttributeName is %s", t.ttlAttr)
		}
		t.ttlOn, t.ttlAttr = spec.Enabled, spec.AttributeName
		return nil
	})
	if aerr != nil {
		return nil, aerr
	}
	return map[string]any{"TimeToLiveSpecification": spec}, nil
}

func (s *Server) describeTTL(body []byte) (any, *apiError) {
	return s.onTable(body, func(t *table, _ time.Time) (any, *apiError) {
		d := map[string]string{"TimeToLiveStatus": "DISABLED"}
		if t.ttlOn {
			d = map[string]string{"TimeToLiveStatus": "ENABLED", "AttributeName": t.ttlAttr}
		}
		return map[string]any{"TimeToLiveDescription": d}, nil
	})
}
