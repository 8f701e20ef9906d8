package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lua"
)

func TestCommandStats(t *testing.T) {
	t.Parallel()
	c := redistest.NewServer(t, nil).Client(t)
	ctx := context.Background()
	before, err := commandStats(ctx, c)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	}
	after, err := commandStats(ctx, c)
	require.NoError(t, err)
	d := statsSince(after, before)
	require.InDelta(t, 3, d["set"].Calls, 1e-9)
	require.GreaterOrEqual(t, d["set"].Usec, 0.0)
	_, ok := d["get"]
	require.False(t, ok, "commands not called since are left out")
}

func TestByCost(t *testing.T) {
	t.Parallel()
	stats := map[string]cmdStat{"evalsha": {10, 500}, "info": {1, 900}, "lpush": {5, 50}, "hset": {5, 50}}
	require.Equal(t, []string{"evalsha", "hset", "lpush"}, byCost(stats, ownCommands))
	require.InDelta(t, 550, usecOf(stats, []string{"evalsha", "lpush", "nope"}), 1e-9)
}

func TestCommandLabel(t *testing.T) {
	t.Parallel()
	names := scriptNames()
	require.Equal(t, "sluice admit.lua", commandLabel([]string{"evalsha", lua.Admit.Hash(), "3", "a", "b", "c"}, names))
	require.Equal(t, "asynq enqueue",
		commandLabel([]string{"EVALSHA", "0123", "2", "asynq:{default}:t:j42", "asynq:{default}:pending", "x"}, names))
	require.Equal(t, "asynq retry", commandLabel([]string{"evalsha", "0123", "8", "asynq:{q}:t:j1", "asynq:{q}:active",
		"asynq:{q}:lease", "asynq:{q}:retry", "asynq:{q}:processed:2026-11-24"}, names))
	require.Equal(t, "asynq done", commandLabel([]string{"evalsha", "0123", "5", "asynq:{q}:active", "asynq:{q}:lease",
		"asynq:{q}:t:j1", "asynq:{q}:processed:2026-11-24", "asynq:{q}:processed"}, names))
	require.Equal(t, "asynq dequeue", commandLabel([]string{"evalsha", "0123", "4", "asynq:{q}:pending", "asynq:{q}:paused",
		"asynq:{q}:active", "asynq:{q}:lease"}, names))
	require.Equal(t, "asynq server state", commandLabel([]string{"evalsha", "0123", "2", "asynq:servers:{h:1:x}", "asynq:workers:{h:1:x}"}, names))
	require.Equal(t, "redis_rate allow", commandLabel([]string{"evalsha", "0123", "1", "rate:rl:t0001"}, names))
	require.Equal(t, "script on other:#, k", commandLabel([]string{"evalsha", "0123", "2", "other:12", "k"}, names))
	body := "return 1"
	require.Equal(t, "mine", commandLabel([]string{"EVAL", body, "0"}, map[string]string{redis.NewScript(body).Hash(): "mine"}),
		"EVAL: the body's SHA1 names it")
	require.Equal(t, "lpush", commandLabel([]string{"LPUSH", "k", "v"}, names))
	require.Equal(t, "config|set", cmdName([]string{"CONFIG", "SET", "a", "b"}))
	require.Equal(t, "?", commandLabel(nil, names))
}

// TestProfileRedis logs a window of a real Redis's commands: a script
// counts as one entry under its name, the commands it runs inside it.
func TestProfileRedis(t *testing.T) {
	t.Parallel()
	c := redistest.NewServer(t, nil).Client(t)
	ctx := context.Background()
	script := redis.NewScript("redis.call('SET', KEYS[1], ARGV[1]) return 1")
	start := time.Now()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = script.Run(ctx, c, []string{"k"}, i).Err()
			_ = c.LPush(ctx, "l:7", i).Err()
			time.Sleep(time.Millisecond)
		}
	}()
	p, err := profileRedis(ctx, c, start, 100*time.Millisecond, 500*time.Millisecond, nil)
	close(stop)
	<-done
	require.NoError(t, err)
	require.Positive(t, p.Stats["lpush"].Calls)
	require.Zero(t, p.Stats["set"].Calls, "the script's SET is inside the script's figure")
	label := "script on k"
	require.Positive(t, p.Stats[label].Calls, "%v", p.Stats)
	require.InDelta(t, p.Stats["lpush"].Calls, p.Stats[label].Calls, 2)
	require.Zero(t, p.Lost)
	require.Greater(t, p.To, p.From)
	// The log's settings are back.
	got, err := c.ConfigGet(ctx, "slowlog-log-slower-than").Result()
	require.NoError(t, err)
	require.Equal(t, "10000", got["slowlog-log-slower-than"])
}

func TestProfileRows(t *testing.T) {
	t.Parallel()
	p := &redisProfile{Stats: map[string]cmdStat{"sluice admit.lua": {200, 6000}, "lpush": {100, 4000}, "info": {1, 3000}}}
	rows := profileRows(p, 100)
	require.Len(t, rows, 2, "the benchmark's own commands left out")
	require.Equal(t, profileRow{label: "sluice admit.lua", callsPerJob: 2, usecPerCall: 30, usec: 60, share: 0.6}, rows[0])
	require.Equal(t, "lpush", rows[1].label)
	require.Nil(t, profileRows(p, 0))
	require.Nil(t, profileRows(nil, 10))
	arr := [][]arrival{{{at: ms(5)}, {at: ms(15)}, {at: ms(16), status: rejectedRate}}, {{at: ms(30)}}}
	require.Equal(t, 2, completedBetween(arr, ms(10), ms(30)))
}
