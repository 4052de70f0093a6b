// Package ddbrate is the RunTask rate that every gateway replica shares:
// ECS's RunTask call rate and Fargate's task launch rate hold for the whole
// account and Region, so N replicas with a token bucket each would send N
// times the rate. A Limiter keeps both buckets in one DynamoDB item (of the
// lease store's leases table) and admits each RunTask call with one
// conditional write; it implements ecs.RateLimiter. The same Limiter with
// no task bucket (Config.TaskRate and TaskBurst 0, item RegisterKey) is
// RegisterTaskDefinition's rate (1/s, burst 20), shared the same way.
//
// The buckets are GCRA (generic cell rate algorithm) states: for each, the
// theoretical arrival time (TAT) at which the bucket is full again. A call
// of n tasks arriving at now may start at
//
//	at = max(now, TATc + Tc − Bc·Tc, max(TATt, now) + n·Tt − Bt·Tt)
//
// (T = 1/rate, B = burst; TATc taken as max(TATc, now) too), and advances
// both: TAT = max(TAT, at) + tokens·T. A replica computes this from the item
// as it last saw it, writes it with a condition on the item's version, and
// sleeps until at. The writes are serialised by the condition, each one
// keeps TAT − at ≤ B·T for the tokens it admitted, so in any window of
// length w the admitted calls of all replicas, in whatever order their
// times fall, hold at most B + w·rate tokens of each bucket.
//
// This package must not import gateway, warmpool, or the providers (ecs
// names the interface it implements).
package ddbrate
