package dynamostore

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC)

func TestTaskItem_RoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  warmpool.TaskRecord
	}{
		{name: "every field", rec: warmpool.TaskRecord{
			ID: "tsk-1", Pool: "p", Provider: "process", ProviderID: "pid-1", State: warmpool.TaskLeased,
			AgentURL: "http://127.0.0.1:9", AgentToken: "tok", LeaseID: "sbx-1", Generation: 7, Reason: "r",
			CreatedAt: t0, UpdatedAt: t0.Add(time.Second), LaunchDeadline: t0.Add(time.Minute), Version: 4,
		}},
		{name: "zero times and empty strings", rec: warmpool.TaskRecord{ID: "tsk-2", Pool: "p", State: warmpool.TaskLaunching, Version: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			it := taskItem(tc.rec, 8, 3, -1)
			assert.Equal(t, avS("task#"+tc.rec.ID), it[attrPK])
			assert.Equal(t, avS(shardKey("p", shardOf(tc.rec.ID, 8))), it[attrPoolPK])
			assert.Equal(t, avN(3), it[attrCShard])
			assert.NotContains(t, it, attrReadyPK, "a new task is not ready")
			got, err := decodeTask(it)
			require.NoError(t, err)
			assert.Equal(t, tc.rec, got)
		})
	}
}

func TestLeaseItem_RoundTripAndIndexes(t *testing.T) {
	active := warmpool.Lease{
		ID: "sbx-1", Pool: "p", TaskID: "tsk-1", Owner: "o", State: warmpool.LeaseActive, Generation: 2,
		AgentURL: "http://127.0.0.1:9", AgentToken: "tok", ProviderTaskID: "proc-1", Labels: map[string]string{"run": "a"},
		Env: map[string]string{"A": "1"}, IdempotencyKey: "k", Duration: time.Minute,
		CreatedAt: t0, ExpiresAt: t0.Add(time.Minute), Version: 1,
	}
	ended := active
	ended.State, ended.Reason, ended.EndedAt, ended.Version = warmpool.LeaseReleased, "done", t0.Add(30*time.Second), 2
	tests := []struct {
		name      string
		l         warmpool.Lease
		forgotten bool
		has, lack []string
	}{
		{name: "active is in the expiry index", l: active, has: []string{attrOwnerPK, attrExpiryPK, attrExpirySK}, lack: []string{attrEndedPK, attrTTL, fIdemForgotten}},
		{name: "ended is in the end index with a TTL", l: ended, forgotten: true, has: []string{attrOwnerPK, attrEndedPK, attrEndedSK, attrTTL, fIdemForgotten}, lack: []string{attrExpiryPK}},
		{name: "no labels or key", l: warmpool.Lease{ID: "sbx-2", Owner: "o", State: warmpool.LeaseActive, CreatedAt: t0, ExpiresAt: t0}, lack: []string{fLabels, fEnv, fIdemKey}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			it := leaseItem(tc.l, 8, time.Hour, tc.forgotten)
			for _, a := range tc.has {
				assert.Contains(t, it, a)
			}
			for _, a := range tc.lack {
				assert.NotContains(t, it, a)
			}
			assert.Equal(t, tc.forgotten, idemForgotten(it))
			assert.NotContains(t, it, fEnv, "the env is an item of its own")
			got, err := decodeLease(it)
			require.NoError(t, err)
			want := tc.l
			want.Env = nil
			assert.Equal(t, want, got)
			if env := envItem(tc.l); len(tc.l.Env) > 0 {
				assert.Equal(t, avS("env#"+tc.l.ID), env[attrPK])
				assert.Equal(t, tc.l.Env, (&decoder{it: env}).m(fEnv))
			} else {
				assert.Nil(t, env)
			}
		})
	}
	it := leaseItem(ended, 8, time.Hour, false)
	assert.Equal(t, avN(ended.EndedAt.Add(time.Hour).Unix()), it[attrTTL])
	assert.False(t, ttlPassed(it, ended.EndedAt.Add(59*time.Minute)))
	assert.True(t, ttlPassed(it, ended.EndedAt.Add(time.Hour+time.Second)), "past its TTL the lease counts as purged")
}

func TestDecode_BadAttributes(t *testing.T) {
	tests := []struct {
		name string
		it   item
		want string
	}{
		{name: "missing id", it: item{fPool: avS("p")}, want: "id"},
		{name: "number is a string", it: item{fID: avS("x"), fVersion: avS("1")}, want: "version"},
		{name: "number is not an integer", it: item{fID: avS("x"), fGeneration: avN(1), fVersion: &types.AttributeValueMemberN{Value: "1.5"}}, want: "version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeTask(tc.it)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := decodeLease(item{fID: avS("x"), fLabels: &types.AttributeValueMemberM{Value: item{"k": avN(1)}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "labels")
}
