// Package asynqtest gives tests a client for asynq's queues on the shared
// test Redis of internal/redistest.
package asynqtest

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/redisurl"
)

// Client returns a client for asynq's queues on the shared test server,
// closed when the test ends. In the Cluster pass (SLUICE_TEST_CLUSTER=1) it
// is made the way an asynq application reaches a Cluster, from
// asynq.RedisClusterClientOpt (through internal/redisurl, as the binaries
// do), apart from the *redis.ClusterClient sluice's limiter uses.
func Client(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	if !redistest.ClusterMode() {
		return redistest.Client(tb)
	}
	u, err := redisurl.Parse(redistest.ClusterURL(tb))
	require.NoError(tb, err)
	opt := u.AsynqOpt()
	_, ok := opt.(asynq.RedisClusterClientOpt)
	require.True(tb, ok, "the cluster URL gives asynq.RedisClusterClientOpt, got %T", opt)
	c, ok := opt.MakeRedisClient().(redis.UniversalClient)
	require.True(tb, ok)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
