package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// Where a set-up's Redis spends its CPU: INFO commandstats over the whole
// run, and a profile of one window from Redis's slow log with every
// command logged, which tells the scripts apart.

// cmdStat is what Redis spent on one command or script: calls and
// microseconds of execution.
type cmdStat struct {
	Calls, Usec float64
}

// commandStats reads INFO commandstats: command -> calls and µs. Commands
// a script runs are counted both in the script's line and in their own.
func commandStats(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	text, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			}
		}
		out[name] = st
	}
	return out, nil
}

// statsSince is after less before, leaving out commands not called since.
func statsSince(after, before map[string]cmdStat) map[string]cmdStat {
	out := map[string]cmdStat{}
	for k, a := range after {
		b := before[k]
		if d := (cmdStat{a.Calls - b.Calls, a.Usec - b.Usec}); d.Calls > 0 {
			out[k] = d
		}
	}
	return out
}

// ownCommands are the benchmark's own commands to its Redis (sampling,
// reading INFO, profiling): left out of the set-up's figures.
var ownCommands = []string{"info", "slowlog|get", "slowlog|reset", "config|set", "config|get", "multi", "exec", "ping", "hello", "client|setinfo"}

// usecOf sums the µs of the named commands.
func usecOf(stats map[string]cmdStat, names []string) float64 {
	total := 0.0
	for _, n := range names {
		total += stats[n].Usec
	}
	return total
}

// byCost lists stats' keys, the most µs first, leaving out skip.
func byCost(stats map[string]cmdStat, skip []string) []string {
	var keys []string
	for k := range stats {
		if !slices.Contains(skip, k) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		if stats[a].Usec != stats[b].Usec {
			if stats[a].Usec > stats[b].Usec {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys
}

// redisProfile is what Redis ran in one window of a run, from its slow
// log with every command logged: the commands clients sent and the
// scripts, by name (the commands a script runs are inside its figure).
type redisProfile struct {
	From, To time.Duration // the window, since the run's start
	Stats    map[string]cmdStat
	Lost     int // entries the log dropped before they were read
}

// scriptNames names sluice's scripts by their SHA1.
func scriptNames() map[string]string {
	names := map[string]string{}
	for name, s := range map[string]*redis.Script{"admit.lua": lua.Admit, "release.lua": lua.Release, "renew.lua": lua.Renew,
		"cooldown.lua": lua.Cooldown, "stats.lua": lua.Stats, "room.lua": lua.Room, "line.lua": lua.Line, "handover.lua": lua.Handover, "capacity.lua": lua.Capacity,
		"wait.lua": lua.Wait, "park.lua": lua.Park, "block.lua": lua.Block, "settle.lua": lua.Settle, "forward.lua": lua.Forward, "fleet.lua": lua.Fleet, "recover.lua": lua.Recover, "repark.lua": lua.Repark, "prioritize.lua": lua.Prioritize, "adapt.lua": lua.Adapt} {
		names[s.Hash()] = "sluice " + name
	}
	return names
}

var digits = regexp.MustCompile(`[0-9]+`)

// keyShape is a key with its numbers as #, so that every task's or
// tenant's key of one kind reads the same.
func keyShape(k string) string { return digits.ReplaceAllString(k, "#") }

// commandLabel names a logged command: a script by its name (sluice's by
// their SHA1, asynq's and redis_rate's by the keys they touch), any other
// command by its name.
func commandLabel(args []string, names map[string]string) string {
	if len(args) == 0 {
		return "?"
	}
	cmd := cmdName(args)
	if cmd != "evalsha" && cmd != "eval" {
		return cmd
	}
	if len(args) > 1 {
		sha := args[1]
		if cmd == "eval" {
			// the script itself: its SHA1 names it
			sum := sha1.Sum([]byte(args[1]))
			sha = hex.EncodeToString(sum[:])
		}
		if n, ok := names[sha]; ok {
			return n
		}
	}
	var keys []string
	if len(args) > 2 {
		if n, err := strconv.Atoi(args[2]); err == nil {
			for i := 0; i < min(n, 4) && 3+i < len(args); i++ {
				keys = append(keys, args[3+i])
			}
		}
	}
	if n := otherScript(keys); n != "" {
		return n
	}
	shapes := make([]string, 0, 2)
	for _, k := range keys[:min(len(keys), 2)] {
		shapes = append(shapes, keyShape(k))
	}
	return "script on " + strings.Join(shapes, ", ")
}

// asynqScripts names asynq v0.26's scripts (internal/rdb) by the kinds
// of their first keys.
var asynqScripts = map[string]string{
	"t pending":               "asynq enqueue",
	"t scheduled":             "asynq schedule",
	"pending paused":          "asynq dequeue",
	"active lease t":          "asynq done",
	"active lease pending":    "asynq requeue",
	"active lease completed":  "asynq mark as complete",
	"t active lease retry":    "asynq retry",
	"t active lease archived": "asynq archive",
	"scheduled pending":       "asynq forward (scheduled)",
	"retry pending":           "asynq forward (retry)",
	"lease":                   "asynq lease check",
	"servers workers":         "asynq server state",
}

// otherScript names asynq's and redis_rate's scripts by their keys; ""
// when it does not know them.
func otherScript(keys []string) string {
	if len(keys) > 0 && strings.HasPrefix(keys[0], "rate:") {
		return "redis_rate allow"
	}
	var kinds []string
	for _, k := range keys {
		_, rest, ok := strings.Cut(k, "}:")
		if !strings.HasPrefix(k, "asynq:") {
			return ""
		}
		if !ok {
			// asynq:servers:{host:pid:id}
			rest = strings.Split(strings.TrimPrefix(k, "asynq:"), ":")[0]
		}
		kind, _, _ := strings.Cut(rest, ":")
		kinds = append(kinds, kind)
	}
	for n := len(kinds); n > 0; n-- {
		if name, ok := asynqScripts[strings.Join(kinds[:n], " ")]; ok {
			return name
		}
	}
	return ""
}

// profileEvery is how often the profile reads and empties the slow log.
const profileEvery = 200 * time.Millisecond

// profileRedis logs every command Redis runs from start+from for window
// (or until stop closes, when that is sooner), reads the log every
// profileEvery, and puts the log's settings back.
func profileRedis(ctx context.Context, c *redis.Client, start time.Time, from, window time.Duration, stop <-chan struct{}) (*redisProfile, error) {
	t := time.NewTimer(time.Until(start.Add(from)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	}
	old, err := c.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		return nil, err
	}
	restore := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, k := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
			_ = c.ConfigSet(rctx, k, old[k]).Err()
		}
		_ = c.SlowLogReset(rctx).Err()
	}
	defer restore()
	if err := c.ConfigSet(ctx, "slowlog-max-len", "100000").Err(); err != nil {
		return nil, err
	}
	p := &redisProfile{From: time.Since(start), Stats: map[string]cmdStat{}}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		return nil, err
	}
	if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		return nil, err
	}
	names := scriptNames()
	next := int64(-1) // the id the next entry should have
	end := time.Now().Add(window)
	tick := time.NewTicker(profileEvery)
	defer tick.Stop()
	for last := false; !last; {
		stopped := false
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		case <-stop:
			stopped = true
		}
		if last = stopped || !time.Now().Before(end); last {
			if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err(); err != nil {
				return nil, err
			}
			p.To = time.Since(start)
		}
		var got *redis.SlowLogCmd
		if _, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			got = pipe.SlowLogGet(ctx, 100000)
			pipe.SlowLogReset(ctx)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read the slow log: %w", err)
		}
		entries := got.Val()
		// newest first
		for i := len(entries) - 1; i >= 0; i-- {
			e := entries[i]
			if next >= 0 && e.ID > next {
				p.Lost += int(e.ID - next)
			}
			next = e.ID + 1
			if e.ClientAddr == "?:0" || slices.Contains(ownCommands, cmdName(e.Args)) {
				// a command a script ran (its time is the script's), or
				// the benchmark's own
				continue
			}
			l := commandLabel(e.Args, names)
			st := p.Stats[l]
			st.Calls++
			st.Usec += float64(e.Duration.Microseconds())
			p.Stats[l] = st
		}
		if next >= 0 {
			// the SLOWLOG GET just run was logged, then emptied by the
			// RESET: the next entry has the id after it
			next++
		}
	}
	return p, nil
}

// cmdName is a logged command's name as INFO commandstats writes it:
// "config|set" for a command with subcommands.
func cmdName(args []string) string {
	if len(args) == 0 {
		return ""
	}
	name := strings.ToLower(args[0])
	switch name {
	case "config", "slowlog", "client":
		if len(args) > 1 {
			name += "|" + strings.ToLower(args[1])
		}
	}
	return name
}

// completedBetween counts the 2xx answers the downstream gave between
// from and to.
func completedBetween(arrivals [][]arrival, from, to time.Duration) int {
	n := 0
	for _, arr := range arrivals {
		for _, a := range arr {
			if a.status == accepted && a.at >= from && a.at <= to {
				n++
			}
		}
	}
	return n
}

// profileRow is one line of a profile's table: a command or script, per
// job completed in the window.
type profileRow struct {
	label                          string
	callsPerJob, usecPerCall, usec float64 // usec: per job
	share                          float64 // of the window's command time
}

// profileRows turns a profile into rows, the most µs first, per job
// completed in the window (none when no job was).
func profileRows(p *redisProfile, jobs int) []profileRow {
	if p == nil || jobs == 0 {
		return nil
	}
	keys := byCost(p.Stats, ownCommands)
	total := usecOf(p.Stats, keys)
	var rows []profileRow
	for _, k := range keys {
		st := p.Stats[k]
		r := profileRow{label: k, callsPerJob: st.Calls / float64(jobs), usec: st.Usec / float64(jobs)}
		if st.Calls > 0 {
			r.usecPerCall = st.Usec / st.Calls
		}
		if total > 0 {
			r.share = st.Usec / total
		}
		rows = append(rows, r)
	}
	return rows
}
