package ecssim

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Limits of request members (ECS's).
const (
	maxStartedBy   = 128
	maxClientToken = 64
	maxTagKey      = 128
	maxTagValue    = 256
)

var familyPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

type strategyItem struct {
	CapacityProvider string `json:"capacityProvider"`
	Weight           int    `json:"weight"`
	Base             int    `json:"base"`
}

type runTaskInput struct {
	Cluster                  string          `json:"cluster"`
	TaskDefinition           string          `json:"taskDefinition"`
	Count                    *int            `json:"count"`
	CapacityProviderStrategy []strategyItem  `json:"capacityProviderStrategy"`
	LaunchType               string          `json:"launchType"`
	PlatformVersion          string          `json:"platformVersion"`
	NetworkConfiguration     *networkConfig  `json:"networkConfiguration"`
	StartedBy                string          `json:"startedBy"`
	Tags                     []wireTag       `json:"tags"`
	ClientToken              string          `json:"clientToken"`
	Overrides                json.RawMessage `json:"overrides"`
	Group                    string          `json:"group"`
}

type networkConfig struct {
	AwsvpcConfiguration *struct {
		Subnets        []string `json:"subnets"`
		SecurityGroups []string `json:"securityGroups"`
		AssignPublicIP string   `json:"assignPublicIp"`
	} `json:"awsvpcConfiguration"`
}

type runTaskOutput struct {
	Tasks    []wireTask    `json:"tasks"`
	Failures []wireFailure `json:"failures"`
}

// runTask starts 1..10 tasks within the call and launch buckets.
func (s *Server) runTask(body []byte) (any, *apiError) {
	var in runTaskInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	count := 1
	if in.Count != nil {
		count = *in.Count
	}
	if count < 1 || count > MaxTasksPerCall {
		return nil, invalidParam("count must be between 1 and %d, got %d", MaxTasksPerCall, count)
	}
	if in.TaskDefinition == "" {
		return nil, invalidParam("taskDefinition can not be blank")
	}
	if in.LaunchType != "" && len(in.CapacityProviderStrategy) > 0 {
		return nil, invalidParam("Specifying both a launch type and capacity provider strategy is not supported.")
	}
	if in.LaunchType != "" && in.LaunchType != "FARGATE" {
		return nil, invalidParam("ecssim (a simulator of ECS) simulates launch type FARGATE only, got %q", in.LaunchType)
	}
	for _, it := range in.CapacityProviderStrategy {
		if it.CapacityProvider != capacityFargate && it.CapacityProvider != capacitySpot {
			return nil, invalidParam("The specified capacity provider strategy cannot contain a capacity provider that is not associated with the cluster (ecssim has FARGATE and FARGATE_SPOT), got %q", it.CapacityProvider)
		}
		if it.Weight < 0 || it.Weight > 1000 || it.Base < 0 || it.Base > 100000 {
			return nil, invalidParam("capacityProviderStrategy: weight must be 0..1000 and base 0..100000")
		}
	}
	if nc := in.NetworkConfiguration; nc == nil || nc.AwsvpcConfiguration == nil || len(nc.AwsvpcConfiguration.Subnets) == 0 {
		return nil, invalidParam("Network Configuration must be provided when networkMode 'awsvpc' is specified.")
	}
	if len(in.StartedBy) > maxStartedBy {
		return nil, invalidParam("startedBy: at most %d characters", maxStartedBy)
	}
	if len(in.ClientToken) > maxClientToken {
		return nil, invalidParam("clientToken: at most %d characters", maxClientToken)
	}
	if err := checkTags(in.Tags, len(in.Tags)); err != nil {
		return nil, err
	}
	overrides := noOverrides
	if len(in.Overrides) > 0 && string(in.Overrides) != "null" {
		overrides = append(json.RawMessage(nil), in.Overrides...)
	}
	cluster := clusterName(in.Cluster)
	capacities := assign(in.CapacityProviderStrategy, count)
	now := time.Now()

	s.mu.Lock()
	defer s.mu.Unlock()
	def := s.resolve(in.TaskDefinition)
	if def == nil {
		return nil, clientError(codeClient, "TaskDefinition not found.")
	}
	if def.inactive {
		return nil, clientError(codeClient, "TaskDefinition is inactive")
	}
	if !s.calls.AllowN(now, 1) {
		s.refused.callRate.Add(1)
		s.logRefusal("runtask_calls", "RunTask refused: the call bucket is empty (ThrottlingException, simulated)",
			"rate_per_s", s.cfg.RunTaskRate, "burst", s.cfg.RunTaskBurst)
		return nil, clientError(codeThrottling, "Rate exceeded")
	}
	if in.ClientToken != "" {
		if tok, ok := s.tokens[in.ClientToken]; ok && now.Before(tok.expires) {
			out := runTaskOutput{Tasks: []wireTask{}, Failures: []wireFailure{}}
			for _, id := range tok.ids {
				if t := s.tasks[id]; t != nil {
					out.Tasks = append(out.Tasks, t.wire(true))
				}
			}
			return out, nil
		}
	}
	// The launch buckets: how many tasks of each capacity provider may start.
	want := map[string]int{}
	for _, c := range capacities {
		want[c]++
	}
	allowed := map[string]int{}
	short := false
	for c, n := range want {
		k := min(n, int(math.Floor(s.launches[c].TokensAt(now))))
		allowed[c] = max(k, 0)
		short = short || k < n
	}
	if short && s.cfg.LaunchRefusal == RefuseWithException {
		s.refused.launchRate.Add(1)
		s.logRefusal("fargate_launches", "RunTask refused: the Fargate launch bucket cannot cover the call's tasks (InvalidParameterException Rate exceeded, simulated)",
			"count", count, "rate_per_s", s.cfg.LaunchRate, "burst", s.cfg.LaunchBurst)
		return nil, invalidParam("Rate exceeded")
	}
	if short {
		s.refused.launchRate.Add(1)
		s.logRefusal("fargate_launches", "RunTask: the Fargate launch bucket covers part of the call; the rest are failures (simulated)",
			"count", count, "rate_per_s", s.cfg.LaunchRate, "burst", s.cfg.LaunchBurst)
	}
	for c, n := range allowed {
		if n > 0 {
			s.launches[c].AllowN(now, n)
		}
	}
	out := runTaskOutput{Tasks: []wireTask{}, Failures: []wireFailure{}}
	var ids []string
	for _, c := range capacities {
		if allowed[c] == 0 {
			out.Failures = append(out.Failures, wireFailure{Reason: "Rate exceeded", Detail: "the Fargate task launch rate (simulated)"})
			continue
		}
		allowed[c]--
		t, fail := s.newTask(in, def, cluster, c, overrides, now)
		if fail != nil {
			out.Failures = append(out.Failures, *fail)
			continue
		}
		ids = append(ids, t.id)
		out.Tasks = append(out.Tasks, t.wire(true))
	}
	if in.ClientToken != "" && len(ids) > 0 {
		s.tokens[in.ClientToken] = clientToken{ids: ids, expires: now.Add(s.cfg.wall(tokenTTL))}
		s.expireTokens(now)
	}
	return out, nil
}

// expireTokens drops expired client tokens when there are many. Called
// under s.mu.
func (s *Server) expireTokens(now time.Time) {
	if len(s.tokens) < 4096 {
		return
	}
	for k, v := range s.tokens {
		if !now.Before(v.expires) {
			delete(s.tokens, k)
		}
	}
}

// newTask creates one PROVISIONING task and schedules its start. Called
// under s.mu.
func (s *Server) newTask(in runTaskInput, def *taskDef, cluster, capacity string, overrides json.RawMessage, now time.Time) (*task, *wireFailure) {
	addr := s.addrs.take()
	if addr < 0 {
		s.logRefusal("addresses", "RunTask: no free task address (simulated subnet exhausted)", "addresses", s.addrs.size)
		return nil, &wireFailure{Reason: "RESOURCE:ENI", Detail: fmt.Sprintf("the subnets have no free address (ecssim's %d addresses are in use)", s.addrs.size)}
	}
	var raw [16]byte
	for i := 0; i < len(raw); i += 8 {
		v := s.rng.Uint64()
		for j := range 8 {
			raw[i+j] = byte(v >> (8 * j))
		}
	}
	s.seq++
	id := hex.EncodeToString(raw[:])
	region := s.cfg.Region + ":" + s.cfg.AccountID
	t := &task{
		seq: s.seq, id: id, region: region,
		arn:        "arn:aws:ecs:" + region + ":task/" + cluster + "/" + id,
		cluster:    cluster,
		clusterArn: "arn:aws:ecs:" + region + ":cluster/" + cluster,
		def:        def, startedBy: in.StartedBy, group: in.Group, overrides: overrides,
		tags:    append([]wireTag(nil), in.Tags...),
		desired: statusRunning, createdAt: now, addr: addr,
		platform: in.PlatformVersion,
	}
	if t.platform == "" || t.platform == "LATEST" {
		t.platform = "1.4.0"
	}
	if len(in.CapacityProviderStrategy) > 0 {
		t.capacity = capacity
	} else {
		t.launchType = "FARGATE"
	}
	if t.group == "" {
		t.group = "family:" + def.family
	}
	s.setStatus(t, statusProvisioning)
	s.tasks[id] = t
	s.order = append(s.order, t)
	s.launched.Add(1)
	t.startDur = s.draw(s.cfg.StartMin, s.cfg.StartMax)
	s.schedule(t, evPending, t.startDur/3)
	size, ok := s.cfg.imageSize(def.image)
	if !ok {
		s.schedule(t, evPullFailed, t.startDur/3+s.cfg.wall(pullFailDelay))
		return t, nil
	}
	s.pulled.Add(size)
	s.schedule(t, evRunning, t.startDur+s.cfg.pullTime(size))
	return t, nil
}

// assign gives each of count tasks a capacity provider by the strategy:
// each item's base first, in order, then by weight (the item furthest below
// its share next). No strategy is FARGATE.
func assign(strategy []strategyItem, count int) []string {
	if len(strategy) == 0 {
		out := make([]string, count)
		for i := range out {
			out[i] = capacityFargate
		}
		return out
	}
	out := make([]string, 0, count)
	got := make([]int, len(strategy))
	for i, it := range strategy {
		for got[i] < it.Base && len(out) < count {
			got[i]++
			out = append(out, it.CapacityProvider)
		}
	}
	extra := make([]int, len(strategy))
	for len(out) < count {
		best, bestScore := -1, math.Inf(1)
		for i, it := range strategy {
			if it.Weight == 0 {
				continue
			}
			if score := float64(extra[i]+1) / float64(it.Weight); score < bestScore {
				best, bestScore = i, score
			}
		}
		if best < 0 { // every weight 0: the first item takes the rest
			best = 0
		}
		extra[best]++
		out = append(out, strategy[best].CapacityProvider)
	}
	return out
}

// checkTags checks tags against ECS's rules; total is the number of tags
// the resource would have.
func checkTags(tags []wireTag, total int) *apiError {
	if total > MaxTags {
		return invalidParam("a resource can have at most %d tags, got %d", MaxTags, total)
	}
	for _, tg := range tags {
		switch {
		case tg.Key == "" || len(tg.Key) > maxTagKey:
			return invalidParam("tag keys must be 1 to %d characters, got %q", maxTagKey, tg.Key)
		case len(tg.Value) > maxTagValue:
			return invalidParam("tag values must be at most %d characters (key %q)", maxTagValue, tg.Key)
		case strings.HasPrefix(strings.ToLower(tg.Key), "aws:"):
			return invalidParam("the aws: prefix is reserved (key %q)", tg.Key)
		}
	}
	return nil
}

// find returns the task id (an ARN or id) of cluster names, or nil. Called
// under s.mu.
func (s *Server) find(cluster, id string) *task {
	t := s.tasks[taskID(id)]
	if t == nil || t.cluster != cluster || (strings.HasPrefix(id, "arn:") && id != t.arn) {
		return nil
	}
	return t
}

type stopTaskInput struct {
	Cluster string `json:"cluster"`
	Task    string `json:"task"`
	Reason  string `json:"reason"`
}

type taskOutput struct {
	Task wireTask `json:"task"`
}

// stopTask stops a task: desiredStatus STOPPED at once, its agent down,
// STOPPED after the stop time.
func (s *Server) stopTask(body []byte) (any, *apiError) {
	var in stopTaskInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if len(in.Reason) > MaxStopReason {
		return nil, invalidParam("reason: at most %d characters, got %d", MaxStopReason, len(in.Reason))
	}
	s.mu.Lock()
	t := s.find(clusterName(in.Cluster), in.Task)
	if t == nil {
		s.mu.Unlock()
		return nil, invalidParam("The referenced task was not found.")
	}
	if t.desired == statusStopped {
		out := taskOutput{Task: t.wire(false)}
		s.mu.Unlock()
		return out, nil
	}
	t.desired, t.stopCode, t.stoppedReason = statusStopped, stopUserInitiated, in.Reason
	t.stoppingAt = time.Now()
	t.version++
	if t.last == statusRunning {
		code := int32(143) // the agent ends on SIGTERM
		t.sandboxExitCode = &code
	}
	down := t.agentUp
	t.agentUp = false
	d := s.draw(s.cfg.StopMin, s.cfg.StopMax)
	s.schedule(t, evDeprovision, d/3)
	s.schedule(t, evStopped, d)
	out := taskOutput{Task: t.wire(false)}
	addr := hostPort(t.ip, s.cfg.AgentPort)
	ch := s.change(t)
	s.mu.Unlock()
	if down {
		s.down(addr)
	}
	s.notify(ch)
	return out, nil
}

type describeTasksInput struct {
	Cluster string   `json:"cluster"`
	Tasks   []string `json:"tasks"`
	Include []string `json:"include"`
}

type describeTasksOutput struct {
	Tasks    []wireTask    `json:"tasks"`
	Failures []wireFailure `json:"failures"`
}

func (s *Server) describeTasks(body []byte) (any, *apiError) {
	var in describeTasksInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	switch {
	case len(in.Tasks) == 0:
		return nil, invalidParam("Tasks cannot be empty.")
	case len(in.Tasks) > MaxDescribeIDs:
		return nil, invalidParam("Tasks cannot be longer than %d items, got %d", MaxDescribeIDs, len(in.Tasks))
	}
	withTags, err := includeTags(in.Include)
	if err != nil {
		return nil, err
	}
	cluster := clusterName(in.Cluster)
	out := describeTasksOutput{Tasks: make([]wireTask, 0, len(in.Tasks)), Failures: []wireFailure{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range in.Tasks {
		if t := s.find(cluster, id); t != nil {
			out.Tasks = append(out.Tasks, t.wire(withTags))
		} else {
			out.Failures = append(out.Failures, wireFailure{Arn: id, Reason: "MISSING"})
		}
	}
	return out, nil
}

// includeTags reads an include list that may name TAGS only.
func includeTags(include []string) (bool, *apiError) {
	tags := false
	for _, v := range include {
		if v != "TAGS" {
			return false, invalidParam("include: ecssim (a simulator of ECS) simulates TAGS only, got %q", v)
		}
		tags = true
	}
	return tags, nil
}

type tagResourceInput struct {
	ResourceArn string    `json:"resourceArn"`
	Tags        []wireTag `json:"tags"`
}

// tagResource adds or replaces tags of a task.
func (s *Server) tagResource(body []byte) (any, *apiError) {
	var in tagResourceInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if len(in.Tags) == 0 {
		return nil, invalidParam("tags: at least one tag is required")
	}
	if !strings.Contains(in.ResourceArn, ":task/") {
		return nil, invalidParam("ecssim (a simulator of ECS) tags tasks only, got %q", in.ResourceArn)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[taskID(in.ResourceArn)]
	if t == nil || t.arn != in.ResourceArn {
		return nil, clientError("ResourceNotFoundException", "The specified task is not found.")
	}
	if t.last == statusStopped {
		return nil, invalidParam("The specified task is stopped.")
	}
	merged := append([]wireTag(nil), t.tags...)
	for _, tg := range in.Tags {
		replaced := false
		for i := range merged {
			if merged[i].Key == tg.Key {
				merged[i].Value, replaced = tg.Value, true
			}
		}
		if !replaced {
			merged = append(merged, tg)
		}
	}
	if err := checkTags(in.Tags, len(merged)); err != nil {
		return nil, err
	}
	t.tags = merged
	return struct{}{}, nil
}

type listTasksInput struct {
	Cluster       string `json:"cluster"`
	StartedBy     string `json:"startedBy"`
	DesiredStatus string `json:"desiredStatus"`
	Family        string `json:"family"`
	LaunchType    string `json:"launchType"`
	MaxResults    *int   `json:"maxResults"`
	NextToken     string `json:"nextToken"`
}

type listTasksOutput struct {
	TaskArns  []string `json:"taskArns"`
	NextToken string   `json:"nextToken,omitempty"`
}

// listTasks pages the tasks of a cluster in the order they were started.
func (s *Server) listTasks(body []byte) (any, *apiError) {
	var in listTasksInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	limit := MaxListPage
	if in.MaxResults != nil {
		limit = *in.MaxResults
	}
	if limit < 1 || limit > MaxListPage {
		return nil, invalidParam("maxResults must be between 1 and %d, got %d", MaxListPage, limit)
	}
	desired := in.DesiredStatus
	switch desired {
	case "":
		desired = statusRunning
	case statusRunning, statusPending, statusStopped:
	default:
		return nil, invalidParam("desiredStatus must be RUNNING, PENDING or STOPPED, got %q", in.DesiredStatus)
	}
	if in.LaunchType != "" && in.LaunchType != "FARGATE" {
		return nil, invalidParam("ecssim (a simulator of ECS) simulates launch type FARGATE only, got %q", in.LaunchType)
	}
	var after uint64
	if in.NextToken != "" {
		v, err := strconv.ParseUint(in.NextToken, 16, 64)
		if err != nil {
			return nil, invalidParam("Invalid nextToken")
		}
		after = v
	}
	cluster := clusterName(in.Cluster)
	out := listTasksOutput{TaskArns: []string{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.order), func(i int) bool { return s.order[i].seq > after })
	for ; i < len(s.order); i++ {
		t := s.order[i]
		if s.tasks[t.id] != t || t.cluster != cluster || (in.StartedBy != "" && t.startedBy != in.StartedBy) ||
			(in.Family != "" && t.def.family != in.Family) || !matchesDesired(t, desired) {
			continue
		}
		if len(out.TaskArns) == limit {
			out.NextToken = strconv.FormatUint(s.order[i-1].seq, 16)
			break
		}
		out.TaskArns = append(out.TaskArns, t.arn)
	}
	return out, nil
}

// matchesDesired is ListTasks' desiredStatus filter.
func matchesDesired(t *task, desired string) bool {
	switch desired {
	case statusStopped:
		return t.desired == statusStopped
	case statusPending:
		return t.desired == statusRunning && t.last != statusRunning
	}
	return t.desired == statusRunning
}

// resolve returns the task definition ref names (ARN, family:revision or
// family: the latest ACTIVE revision), or nil. Called under s.mu.
func (s *Server) resolve(ref string) *taskDef {
	if strings.HasPrefix(ref, "arn:") {
		return s.defByArn[ref]
	}
	family, rev, hasRev := strings.Cut(ref, ":")
	revs := s.defs[family]
	if !hasRev {
		for i := len(revs) - 1; i >= 0; i-- {
			if !revs[i].inactive {
				return revs[i]
			}
		}
		return nil
	}
	n, err := strconv.Atoi(rev)
	if err != nil || n < 1 || n > len(revs) {
		return nil
	}
	return revs[n-1]
}

// registerTaskDefinition keeps a task definition as registered (ECS
// validates container definitions deeply; the simulator checks the family,
// the containers' names and Fargate's cpu, memory and network mode).
func (s *Server) registerTaskDefinition(body []byte) (any, *apiError) {
	var in map[string]json.RawMessage
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, clientError("SerializationException", "%s", err)
	}
	str := func(k string) string {
		var v string
		_ = json.Unmarshal(in[k], &v)
		return v
	}
	family := str("family")
	if !familyPattern.MatchString(family) {
		return nil, clientError(codeClient, "Family contains invalid characters or is longer than 255 characters: %q", family)
	}
	var containers []struct {
		Name  string `json:"name"`
		Image string `json:"image"`
	}
	if err := json.Unmarshal(in["containerDefinitions"], &containers); err != nil || len(containers) == 0 {
		return nil, clientError(codeClient, "Container list cannot be empty.")
	}
	names := make([]string, 0, len(containers))
	image := containers[0].Image
	for _, c := range containers {
		if c.Name == "" {
			return nil, clientError(codeClient, "Container.name should not be null or empty.")
		}
		if c.Name == sandboxContainer {
			image = c.Image
		}
		names = append(names, c.Name)
	}
	var compat []string
	_ = json.Unmarshal(in["requiresCompatibilities"], &compat)
	fargate := false
	for _, c := range compat {
		fargate = fargate || c == "FARGATE"
	}
	if fargate && (str("networkMode") != "awsvpc" || str("cpu") == "" || str("memory") == "") {
		return nil, clientError(codeClient, "Fargate requires task definition to have execution role, awsvpc network mode and task level cpu and memory (networkMode %q, cpu %q, memory %q)",
			str("networkMode"), str("cpu"), str("memory"))
	}
	var tags []wireTag
	if raw, ok := in["tags"]; ok {
		if err := json.Unmarshal(raw, &tags); err != nil {
			return nil, clientError("SerializationException", "tags: %s", err)
		}
		if err := checkTags(tags, len(tags)); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowRegister("RegisterTaskDefinition"); err != nil {
		return nil, err
	}
	rev := len(s.defs[family]) + 1
	arn := fmt.Sprintf("arn:aws:ecs:%s:%s:task-definition/%s:%d", s.cfg.Region, s.cfg.AccountID, family, rev)
	def := &taskDef{family: family, revision: rev, arn: arn, cpu: str("cpu"), memory: str("memory"), containers: names, image: image, tags: tags,
		body: map[string]json.RawMessage{}}
	for k, v := range in {
		if k != "tags" {
			def.body[k] = v
		}
	}
	def.body["taskDefinitionArn"] = mustRaw(arn)
	def.body["revision"] = mustRaw(rev)
	def.body["status"] = mustRaw("ACTIVE")
	def.body["registeredAt"] = mustRaw(epoch(time.Now()))
	def.body["compatibilities"] = mustRaw([]string{"EC2", "FARGATE"})
	s.defs[family] = append(s.defs[family], def)
	s.defByArn[arn] = def
	return taskDefOutput{TaskDefinition: def.body, Tags: tagsOrEmpty(tags)}, nil
}

// mustRaw is v as JSON (plain data: it cannot fail).
func mustRaw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }

// allowRegister takes a token of the register bucket, or answers the
// call's throttle. Called under s.mu.
func (s *Server) allowRegister(op string) *apiError {
	if s.registers.Allow() {
		return nil
	}
	s.refused.registerRate.Add(1)
	s.logRefusal("register_calls", op+" refused: the register bucket is empty (ThrottlingException, simulated)",
		"rate_per_s", s.cfg.RegisterRate, "burst", s.cfg.RegisterBurst)
	return clientError(codeThrottling, "Rate exceeded")
}

type deregisterTaskDefinitionInput struct {
	TaskDefinition string `json:"taskDefinition"`
}

// deregisterTaskDefinition marks a revision INACTIVE (a family without a
// revision is refused, as ECS refuses it): RunTask refuses it from then,
// DescribeTaskDefinition of its ARN shows it INACTIVE, and of its family
// the latest revision still ACTIVE. Deregistering an INACTIVE revision
// again answers it as it is (what ECS answers then is not documented).
func (s *Server) deregisterTaskDefinition(body []byte) (any, *apiError) {
	var in deregisterTaskDefinitionInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(in.TaskDefinition, "arn:") && !strings.Contains(in.TaskDefinition, ":") {
		return nil, invalidParam("You must specify a revision: family:revision or the full ARN, got %q", in.TaskDefinition)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allowRegister("DeregisterTaskDefinition"); err != nil {
		return nil, err
	}
	def := s.resolve(in.TaskDefinition)
	if def == nil {
		return nil, clientError(codeClient, "The specified task definition does not exist.")
	}
	if !def.inactive {
		// A new body: answers encoded outside the lock may hold the old one.
		b := maps.Clone(def.body)
		b["status"] = mustRaw("INACTIVE")
		b["deregisteredAt"] = mustRaw(epoch(time.Now()))
		def.inactive, def.body = true, b
	}
	return taskDefOutput{TaskDefinition: def.body, Tags: tagsOrEmpty(def.tags)}, nil
}

type taskDefOutput struct {
	TaskDefinition map[string]json.RawMessage `json:"taskDefinition"`
	Tags           []wireTag                  `json:"tags"`
}

func tagsOrEmpty(t []wireTag) []wireTag {
	if t == nil {
		return []wireTag{}
	}
	return t
}

type describeTaskDefinitionInput struct {
	TaskDefinition string   `json:"taskDefinition"`
	Include        []string `json:"include"`
}

func (s *Server) describeTaskDefinition(body []byte) (any, *apiError) {
	var in describeTaskDefinitionInput
	if err := decode(body, &in); err != nil {
		return nil, err
	}
	withTags, err := includeTags(in.Include)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	def := s.resolve(in.TaskDefinition)
	if def == nil {
		return nil, clientError(codeClient, "Unable to describe task definition.")
	}
	out := taskDefOutput{TaskDefinition: def.body, Tags: []wireTag{}}
	if withTags {
		out.Tags = tagsOrEmpty(def.tags)
	}
	return out, nil
}
