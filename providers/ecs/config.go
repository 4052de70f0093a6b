package ecs

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults applied by Config.WithDefaults.
const (
	DefaultGatewayID        = "local"
	DefaultCapacityProvider = "FARGATE"
	DefaultPlatformVersion  = "LATEST"
	DefaultAgentPort        = 8000
	DefaultStartTimeout     = 5 * time.Minute
	// DefaultSlowStart is the longest time Fargate usually takes from
	// RunTask to RUNNING (30-90 s for small images without SOCI; image
	// pull is most of it). The default of MaxStarting is LaunchBurst +
	// LaunchRate × DefaultSlowStart: enough start slots that launching at
	// the full launch rate never runs out of them (1,900 at the defaults).
	DefaultSlowStart = 90 * time.Second
	// DefaultMaxQueued bounds the names waiting in the launch queue.
	DefaultMaxQueued = 20000
	// DefaultRunTaskRate and DefaultRunTaskBurst are RunTask calls per
	// second (ECS's RunTask API limit is about 20/s sustained).
	DefaultRunTaskRate  = 20
	DefaultRunTaskBurst = 20
	// DefaultLaunchRate and DefaultLaunchBurst are task launches per second
	// (Fargate: a burst of 100, then about 20/s).
	DefaultLaunchRate  = 20
	DefaultLaunchBurst = 100
	// DefaultTagRate and DefaultTagBurst are TagResource calls per second
	// (one per launched task, naming it): the launch rate, so naming keeps
	// up with launching.
	DefaultTagRate  = 20
	DefaultTagBurst = 20
	// DefaultDescribeRate and DefaultDescribeBurst bound DescribeTasks
	// calls per second (100 tasks each) of one provider: the starting
	// tasks' watcher, Describe, List, Stop and the events' look-ups.
	DefaultDescribeRate  = 20
	DefaultDescribeBurst = 40
	// DefaultRegisterRate and DefaultRegisterBurst are RegisterTaskDefinition
	// (and DeregisterTaskDefinition) calls per second: AWS's published rate
	// for RegisterTaskDefinition, a bucket of 20 refilled at 1 a second
	// (docs/ECS.md, "Limits").
	DefaultRegisterRate  = 1
	DefaultRegisterBurst = 20
	// DefaultFamilyPrefix starts the family of every task definition the
	// provider registers ("quarry-<pool>-<hash>").
	DefaultFamilyPrefix = "quarry-"
	// DefaultEventsWait is how long one ReceiveMessage of the events
	// queue waits for a message (SQS's longest long poll).
	DefaultEventsWait   = 20 * time.Second
	DefaultMaxAttempts  = 8
	DefaultRetryBase    = 250 * time.Millisecond
	DefaultRetryMax     = 10 * time.Second
	DefaultPollInterval = 2 * time.Second
)

// maxPerCall is the most tasks one RunTask call may start (an ECS limit).
const maxPerCall = 10

// maxEventsWait is SQS's longest long poll.
const maxEventsWait = 20 * time.Second

// Config configures the ECS provider. Zero values of the fields with a
// default take it (WithDefaults); Validate names the first bad field of
// each kind. cmd/gateway fills it with envconfig: the tags name each
// field's QUARRY_ECS_* variable (lists comma separated); the ignored fields
// come from elsewhere (GatewayID from the gateway's configuration, TokenKey
// from QUARRY_ECS_TOKEN_KEY in hex or its secret, LogRegion from the AWS
// SDK's region; RetryBase and RetryMax take their defaults).
type Config struct {
	// Cluster is the ECS cluster's name or ARN. Required.
	Cluster string `envconfig:"QUARRY_ECS_CLUSTER"`
	// GatewayID is attached to every task as providers.LabelGateway (a tag)
	// and, hashed, as the tasks' startedBy; List, Describe and Stop only
	// see tasks that carry it.
	GatewayID string `ignored:"true"`
	// Subnets (private, of the cluster's VPC) and SecurityGroups are the
	// tasks' awsvpc network; pools may override them (options "subnets",
	// "security_groups"). At least one subnet is required.
	Subnets        []string `envconfig:"QUARRY_ECS_SUBNETS"`
	SecurityGroups []string `envconfig:"QUARRY_ECS_SECURITY_GROUPS"`
	// AssignPublicIP gives tasks a public IP (default off: private subnets
	// reach registries through a NAT gateway or VPC endpoints).
	AssignPublicIP bool `envconfig:"QUARRY_ECS_ASSIGN_PUBLIC_IP"`
	// ExecutionRoleARN is the task execution role (pull images, read the
	// token key secret, write logs). Required unless every pool supplies
	// its own task definition.
	ExecutionRoleARN string `envconfig:"QUARRY_ECS_EXECUTION_ROLE_ARN"`
	// TaskRoleARN is the role commands in the sandbox get; "" gives them
	// none (the default, and the safe choice).
	TaskRoleARN string `envconfig:"QUARRY_ECS_TASK_ROLE_ARN"`
	// AgentImage is an image with the static exec agent at /execagent and
	// a cp command (e.g. busybox:musl with the agent copied in); the init
	// container copies the agent from it into the shared volume. Required
	// unless every pool supplies its own task definition.
	AgentImage string `envconfig:"QUARRY_ECS_AGENT_IMAGE"`
	// TokenKey is the secret agent tokens are derived from
	// (agentapi.DeriveToken); TokenKeySecretARN is the Secrets Manager
	// secret (or SSM parameter) holding the same key, in hex, which ECS
	// injects into the agent as QUARRY_AGENT_TOKEN_KEY. Both required.
	TokenKey          []byte `ignored:"true"`
	TokenKeySecretARN string `envconfig:"QUARRY_ECS_TOKEN_KEY_SECRET_ARN"`
	// AgentPort is the agent's port in the task (default 8000).
	AgentPort int `envconfig:"QUARRY_ECS_AGENT_PORT"`
	// LogGroup, when set, sends the containers' output to this CloudWatch
	// Logs group (awslogs driver) in LogRegion (required with LogGroup).
	LogGroup  string `envconfig:"QUARRY_ECS_LOG_GROUP"`
	LogRegion string `ignored:"true"`
	// CapacityProvider is the default capacity provider strategy:
	// "FARGATE", "FARGATE_SPOT", or weighted "FARGATE_SPOT:3,FARGATE:1"
	// (name[:weight[:base]]). Pools override it with "capacity_provider".
	CapacityProvider string `envconfig:"QUARRY_ECS_CAPACITY_PROVIDER"`
	// PlatformVersion is the Fargate platform version (default LATEST).
	PlatformVersion string `envconfig:"QUARRY_ECS_PLATFORM_VERSION"`
	// StartTimeout bounds each task from its RunTask until it runs with an
	// IP; a task past it is stopped and reported with the reason.
	StartTimeout time.Duration `envconfig:"QUARRY_ECS_START_TIMEOUT"`
	// MaxStarting caps the tasks between RunTask and running (or stopped)
	// at once, over all Launch calls of the provider. Default: LaunchBurst
	// + LaunchRate × DefaultSlowStart.
	MaxStarting int `envconfig:"QUARRY_ECS_MAX_STARTING"`
	// MaxQueued bounds the names waiting in the launch queue for a start
	// slot and the RunTask rate; a name past it is refused (ErrThrottled).
	MaxQueued int `envconfig:"QUARRY_ECS_MAX_QUEUED"`
	// RunTaskRate/RunTaskBurst bound RunTask calls per second;
	// LaunchRate/LaunchBurst bound tasks launched per second;
	// TagRate/TagBurst bound TagResource calls (one per task) per second.
	RunTaskRate  float64 `envconfig:"QUARRY_ECS_RUN_TASK_RATE"`
	RunTaskBurst int     `envconfig:"QUARRY_ECS_RUN_TASK_BURST"`
	LaunchRate   float64 `envconfig:"QUARRY_ECS_LAUNCH_RATE"`
	LaunchBurst  int     `envconfig:"QUARRY_ECS_LAUNCH_BURST"`
	TagRate      float64 `envconfig:"QUARRY_ECS_TAG_RATE"`
	TagBurst     int     `envconfig:"QUARRY_ECS_TAG_BURST"`
	// DescribeRate/DescribeBurst bound DescribeTasks calls per second (and,
	// in a bucket of their own, DescribeTaskDefinition's look-ups).
	DescribeRate  float64 `envconfig:"QUARRY_ECS_DESCRIBE_RATE"`
	DescribeBurst int     `envconfig:"QUARRY_ECS_DESCRIBE_BURST"`
	// RegisterRate/RegisterBurst bound RegisterTaskDefinition and
	// DeregisterTaskDefinition calls per second (account-wide: shared by
	// every replica with the DynamoDB store).
	RegisterRate  float64 `envconfig:"QUARRY_ECS_REGISTER_RATE"`
	RegisterBurst int     `envconfig:"QUARRY_ECS_REGISTER_BURST"`
	// FamilyPrefix starts the family of every task definition the provider
	// registers (FamilyPrefix + pool + "-" + hash): IAM may limit the
	// gateway's registrations to it, and ForgetImage deregisters nothing
	// outside it. Letters, digits, '-' and '_', at most 40.
	FamilyPrefix string `envconfig:"QUARRY_ECS_FAMILY_PREFIX"`
	// MaxAttempts bounds the tries of a throttled call (ThrottlingException,
	// or InvalidParameterException "Rate exceeded"), with jittered
	// exponential backoff from RetryBase up to RetryMax between them.
	MaxAttempts int           `envconfig:"QUARRY_ECS_MAX_ATTEMPTS"`
	RetryBase   time.Duration `ignored:"true"`
	RetryMax    time.Duration `ignored:"true"`
	// PollInterval is how often DescribeTasks polls the starting tasks.
	PollInterval time.Duration `envconfig:"QUARRY_ECS_POLL_INTERVAL"`
	// EventsQueueURL is the SQS queue an EventBridge rule fills with the
	// cluster's "ECS Task State Change" events; set, NewWatching makes a
	// provider that reads it (providers.Watcher). New refuses it.
	EventsQueueURL string `envconfig:"QUARRY_ECS_EVENTS_QUEUE_URL"`
	// EventsWait is the long poll of one ReceiveMessage (whole seconds,
	// at most 20 s; below a second, a short poll and a pause of
	// PollInterval when the queue is empty).
	EventsWait time.Duration `ignored:"true"`
}

// WithDefaults returns c with every unset field that has a default set to it.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.GatewayID, DefaultGatewayID)
	defaults.Set(&c.CapacityProvider, DefaultCapacityProvider)
	defaults.Set(&c.PlatformVersion, DefaultPlatformVersion)
	defaults.Set(&c.AgentPort, DefaultAgentPort)
	defaults.Set(&c.RunTaskBurst, DefaultRunTaskBurst)
	defaults.Set(&c.LaunchBurst, DefaultLaunchBurst)
	defaults.Set(&c.TagBurst, DefaultTagBurst)
	defaults.Set(&c.DescribeBurst, DefaultDescribeBurst)
	defaults.Set(&c.RegisterBurst, DefaultRegisterBurst)
	defaults.Set(&c.FamilyPrefix, DefaultFamilyPrefix)
	defaults.Set(&c.MaxAttempts, DefaultMaxAttempts)
	defaults.Set(&c.MaxQueued, DefaultMaxQueued)
	defaults.Set(&c.StartTimeout, DefaultStartTimeout)
	defaults.Set(&c.RetryBase, DefaultRetryBase)
	defaults.Set(&c.RetryMax, DefaultRetryMax)
	defaults.Set(&c.PollInterval, DefaultPollInterval)
	defaults.Set(&c.EventsWait, DefaultEventsWait)
	defaults.Set(&c.RunTaskRate, DefaultRunTaskRate)
	defaults.Set(&c.LaunchRate, DefaultLaunchRate)
	defaults.Set(&c.TagRate, DefaultTagRate)
	defaults.Set(&c.DescribeRate, DefaultDescribeRate)
	defaults.Set(&c.RegisterRate, DefaultRegisterRate)
	if c.MaxStarting == 0 && c.LaunchRate > 0 {
		c.MaxStarting = c.LaunchBurst + int(math.Ceil(c.LaunchRate*DefaultSlowStart.Seconds()))
	}
	return c
}

// awsIDPattern matches subnet and security group ids.
var (
	subnetPattern = regexp.MustCompile(`^subnet-[0-9a-f]{8,17}$`)
	sgPattern     = regexp.MustCompile(`^sg-[0-9a-f]{8,17}$`)
	prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,40}$`)
)

// Validate reports every invalid field of c (after defaults), each error
// naming its field. It makes no AWS call.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Cluster == "" {
		bad("Cluster", "must be set")
	}
	if c.GatewayID == "" {
		bad("GatewayID", "must be set")
	}
	if len(c.Subnets) == 0 {
		bad("Subnets", "at least one subnet is required")
	}
	if err := checkIDs(c.Subnets, subnetPattern); err != nil {
		bad("Subnets", "%s", err)
	}
	if err := checkIDs(c.SecurityGroups, sgPattern); err != nil {
		bad("SecurityGroups", "%s", err)
	}
	if len(c.TokenKey) < agentapi.MinTokenKeyBytes {
		bad("TokenKey", "want at least %d bytes, got %d", agentapi.MinTokenKeyBytes, len(c.TokenKey))
	}
	if c.TokenKeySecretARN == "" {
		bad("TokenKeySecretARN", "must be set (the secret ECS injects as QUARRY_AGENT_TOKEN_KEY)")
	} else if !strings.HasPrefix(c.TokenKeySecretARN, "arn:") {
		bad("TokenKeySecretARN", "want the secret's full ARN, got %q", c.TokenKeySecretARN)
	}
	if c.AgentPort < 1 || c.AgentPort > 65535 {
		bad("AgentPort", "must be a port number, got %d", c.AgentPort)
	}
	if c.LogGroup != "" && c.LogRegion == "" {
		bad("LogRegion", "must be set with LogGroup")
	}
	if _, err := parseStrategy(c.CapacityProvider); err != nil {
		bad("CapacityProvider", "%s", err)
	}
	if c.StartTimeout <= 0 {
		bad("StartTimeout", "must be positive, got %s", c.StartTimeout)
	}
	if c.MaxStarting < 1 {
		bad("MaxStarting", "must be at least 1, got %d", c.MaxStarting)
	}
	if c.MaxQueued < 1 {
		bad("MaxQueued", "must be at least 1, got %d", c.MaxQueued)
	}
	if c.RunTaskRate <= 0 || c.RunTaskBurst < 1 {
		bad("RunTaskRate", "rate and burst must be positive, got %g/s burst %d", c.RunTaskRate, c.RunTaskBurst)
	}
	if c.LaunchRate <= 0 || c.LaunchBurst < maxPerCall {
		bad("LaunchRate", "rate must be positive and burst at least %d, got %g/s burst %d", maxPerCall, c.LaunchRate, c.LaunchBurst)
	}
	if c.TagRate <= 0 || c.TagBurst < 1 {
		bad("TagRate", "rate and burst must be positive, got %g/s burst %d", c.TagRate, c.TagBurst)
	}
	if c.DescribeRate <= 0 || c.DescribeBurst < 1 {
		bad("DescribeRate", "rate and burst must be positive, got %g/s burst %d", c.DescribeRate, c.DescribeBurst)
	}
	if c.RegisterRate <= 0 || c.RegisterBurst < 1 {
		bad("RegisterRate", "rate and burst must be positive, got %g/s burst %d", c.RegisterRate, c.RegisterBurst)
	}
	if !prefixPattern.MatchString(c.FamilyPrefix) {
		bad("FamilyPrefix", "want 1 to 40 letters, digits, '-' or '_', got %q", c.FamilyPrefix)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.RetryBase <= 0 || c.RetryMax < c.RetryBase {
		bad("RetryBase", "want 0 < RetryBase <= RetryMax, got %s and %s", c.RetryBase, c.RetryMax)
	}
	if c.PollInterval <= 0 {
		bad("PollInterval", "must be positive, got %s", c.PollInterval)
	}
	if c.EventsQueueURL != "" && !strings.HasPrefix(c.EventsQueueURL, "https://") && !strings.HasPrefix(c.EventsQueueURL, "http://") {
		bad("EventsQueueURL", "want the queue's URL (https://sqs.<region>.amazonaws.com/<account>/<name>), got %q", c.EventsQueueURL)
	}
	if c.EventsWait < 0 || c.EventsWait > maxEventsWait {
		bad("EventsWait", "must be within 0..%s, got %s", maxEventsWait, c.EventsWait)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ecs provider config: %w", err)
	}
	return nil
}

// checkIDs reports the first id that does not match pattern.
func checkIDs(ids []string, pattern *regexp.Regexp) error {
	for i, id := range ids {
		if !pattern.MatchString(id) {
			return fmt.Errorf("[%d] %q is not an id of the form %s", i, id, pattern)
		}
	}
	return nil
}
