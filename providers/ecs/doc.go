// Package ecs is the provider that runs each sandbox task as an AWS ECS
// task on Fargate (or Fargate Spot), in private subnets of the cluster's VPC
// (awsvpc, no public IP by default). Any image works: the task definition
// of a pool adds an init container that copies the static exec agent from
// Config.AgentImage into a volume shared with the sandbox container, whose
// entry point is the agent. Task definitions are registered once per pool
// content (the family is named by a hash of the rendered definition and
// looked up before registering), or supplied by the pool
// ("task_definition" option, e.g. from Terraform).
//
// Launches go through a launch controller: a bounded launch queue, one
// FIFO per pool, whose dispatcher gives names out in batches of up to 10
// of one pool at a time, taking the pools in turn; one RunTask call (count
// = the batch's size, shared tags) per batch, then one TagResource per
// task for its name tag. A RateLimiter keeps RunTask calls and task
// launches within the account's rates (in-process by default; ddbrate
// shares it between replicas through DynamoDB), token buckets keep
// TagResource and DescribeTasks within the process's, throttles (including
// InvalidParameterException and ClientException "Rate exceeded") are
// retried with jittered backoff, a semaphore caps the tasks starting at
// once, and one watcher per provider polls every starting task with
// DescribeTasks in batches of 100 (and, with events, learns from them too)
// until each runs with a private IP, stops (it is reported with ECS's
// stopped reason) or passes its deadline (it is stopped).
//
// Images on demand (images.go, imagetable.go, pullerrors.go): the
// provider is a providers.ImagePreparer and a providers.ImageCache.
// PrepareImage finds or registers a pool's task definition (once per
// family however many wait; RegisterTaskDefinition and
// DeregisterTaskDefinition within a rate of their own, Deps.Register: AWS's
// 1/s, burst 20, shared by every replica through ddbrate with the DynamoDB
// store; the look-ups within a DescribeTaskDefinition bucket of their own)
// and remembers it in a bounded table, which Images reports; ForgetImage
// deregisters an on-demand pool's (Spec.Class set), never a configured
// pool's. An on-demand pool's tasks and task definitions carry
// providers.LabelClass. ECS checks an image only when a task pulls it:
// pullFailure reads a task's stopped reason (CannotPullContainerError, …)
// as an *providers.ImageError (not_found, denied, unreachable, invalid).
//
// NewWatching makes a provider that also implements providers.Watcher:
// it drains an SQS queue that an EventBridge rule fills with the cluster's
// "ECS Task State Change" events (Config.EventsQueueURL) and delivers the
// state changes of this gateway's tasks, named from what the provider saw
// (or one DescribeTasks per received batch). New makes one without events.
//
// The provider keeps nothing in memory that matters: every task carries
// the quarry.* tags and a startedBy derived from the gateway id, so List
// (ListTasks by startedBy, then DescribeTasks) finds the tasks of an
// earlier gateway. The agent's token is never in the task's definition,
// overrides or tags: ECS injects a per-deployment key from Secrets Manager
// (QUARRY_AGENT_TOKEN_KEY), the task definition tells the agent to use its
// task ARN as the nonce (QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn, read
// from the ECS task metadata endpoint), and the agent and the provider both
// derive the token with agentapi.DeriveToken. docs/ECS.md has the whole
// story.
//
// Files: provider.go the Provider (New, Close, Launch, Describe, List,
// Stop) and the start of each task (its RunTask input, its name tag, the
// wait until it runs); dispatch.go the launch queue and its dispatcher,
// which runs each batch's RunTask; launcher.go the AWS side of launches
// (rates, retries, start slots) and the watcher of starting tasks; rate.go
// the RateLimiter and its in-process buckets; spec.go a pool's settings
// (options, Fargate sizes) and its rendered task definition; render.go
// RenderTaskDefinition, for tools; images.go, imagetable.go and
// pullerrors.go images on demand; events.go Watching (the events queue);
// task.go an ECS task as a providers.Task; names.go the bounded cache of
// task names by ARN; errors.go ECS's errors read as throttled, invalid,
// inactive or not found; metrics.go the Prometheus collectors; api.go the
// narrow ECS and SQS interfaces; config.go Config (defaults, Validate).
//
// This package must not import gateway, warmpool or another provider
// (providers/ecs/ddbrate, its shared rate, imports none of them either).
package ecs
