// Package ecssim is a simulator of ECS on Fargate — not ECS — for
// benchmarks only: the fleet simulation (bench/scalebench, issue 13) runs
// real gateway replicas with the real ECS provider against it, at 10,000
// tasks. Every figure it reports is a simulated one.
//
// A Server speaks ECS's JSON protocol (POST /, X-Amz-Target
// AmazonEC2ContainerServiceV20141113.<Operation>, application/x-amz-json-1.1)
// on a loopback address, so the AWS SDK and providers/ecs run unchanged
// (AWS_ENDPOINT_URL_ECS). It serves exactly what providers/ecs calls:
// RunTask, StopTask, DescribeTasks, TagResource, ListTasks,
// RegisterTaskDefinition, DescribeTaskDefinition and
// DeregisterTaskDefinition, with the fields the provider sends and reads; a parameter it does not simulate is refused
// with InvalidParameterException naming it, never ignored. Request
// signatures are not checked.
//
// What it simulates of ECS's published behaviour
// (/work/shared/reference/aws-limits.md):
//   - limits: RunTask count 1..10; RunTask calls from a token bucket of 20
//     a second (burst 20; over it ThrottlingException "Rate exceeded");
//     Fargate task launches from a bucket of 100 refilled at 20 a second,
//     one for FARGATE and one for FARGATE_SPOT (a call whose tasks the
//     bucket cannot cover is refused whole with InvalidParameterException
//     "Rate exceeded", or, with Config.LaunchRefusal "failures", starts what
//     it covers and reports the rest in failures); DescribeTasks at most 100
//     ids; ListTasks pages of at most 100; 50 tags per task; StopTask
//     reasons of at most 255 characters; RegisterTaskDefinition from a
//     bucket of 20 refilled at 1 a second (AWS's published rate;
//     DeregisterTaskDefinition takes from the same bucket, a choice of the
//     simulator), over it ThrottlingException "Rate exceeded";
//   - task definitions: revisions per family; DeregisterTaskDefinition of
//     a revision makes it INACTIVE (RunTask refuses it; the family then
//     describes its latest ACTIVE revision, or none);
//   - images (images.go): a task pulls its sandbox container's image after
//     its placement and runs after its drawn start time plus size /
//     Config.PullRate (0 by default: no pull time). An image's size comes
//     from the simulated registry table (Config.Images) or, when absent
//     there, DefaultImageSize (64 MiB to 2 GiB, a function of its name);
//     with Config.StrictRegistry an image absent from the table does not
//     exist: its task stops while starting with CannotPullContainerError
//     "… not found";
//   - task lifecycle: PROVISIONING at RunTask; PENDING, with its ENI
//     attachment and private IPv4 address, after a third of its start
//     time; RUNNING after its start time, drawn uniformly from 30–90 s
//     (Config.StartMin, StartMax); StopTask sets desiredStatus STOPPED at
//     once (stop code UserInitiated, the caller's reason) and the task is
//     DEPROVISIONING, then STOPPED after 2–6 s; stopped tasks stay
//     describable (and listable with desiredStatus STOPPED) for an hour;
//   - idempotency: a RunTask with a clientToken seen before returns the
//     tasks that call started, without starting or launching more;
//   - tags: RunTask's tags, TagResource, and DescribeTasks' include TAGS;
//     task definitions by family (the latest ACTIVE revision),
//     family:revision or ARN;
//   - counts: requests, errors and throttles by operation, tasks by state
//     and refusals by limit (Stats, GET /ecssim/stats).
//
// Every duration (start and stop times, the retention, pulls) is
// multiplied by Config.TimeScale and every rate (the RunTask, launch and
// register buckets' refill, the pull rate) divided by it: the simulated world runs 1/TimeScale times faster than
// the wall clock, and stays consistent. Bucket sizes and per-call limits are
// counts, not scaled. docs/ARCHITECTURE.md ("The fleet simulation") gives
// the whole rule, for the gateways' settings too.
//
// Each task's private IP is its own address in 127.B.0.0/16 (Config.AddrBase
// is B; several consecutive B for more than 64,000 addresses), and when the
// task runs its agent is brought up on IP:AgentPort through Config.Agents
// (bench/agentsim) with the token the real agent derives from the
// task's ARN and the token key ECS would inject (Config.TokenKey); when the
// task stops, or starts to, its agent is taken down. Addresses are not
// reused while unused ones remain; then the longest free is reused first.
//
// One goroutine applies the lifecycle's transitions, from a heap ordered by
// time: the work grows with the tasks that change, not with the tasks that
// exist. Config.OnChange sees every change of a task's status, for a sink
// that posts ECS task state change events (EventBridge's shape) to a queue.
//
// Known gaps: one account and region; clusters exist when named (no
// ClusterNotFoundException); no container instances, services, task sets,
// capacity shortages, Spot interruptions or quotas on running tasks or
// vCPUs; no API rate limits besides RunTask's and the task definitions'
// (DescribeTasks, ListTasks, TagResource, StopTask and
// DescribeTaskDefinition are never throttled); overrides are echoed, not
// applied; pulls take time but are not shared or cached, and fail only
// for an image a strict registry does not hold (no denied or unreachable
// registries); a task never fails to start otherwise unless its agent
// cannot come up.
//
// It imports no other Quarry package but execagent/agentapi and
// internal/defaults.
package ecssim
