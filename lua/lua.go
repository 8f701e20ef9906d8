// Package lua holds sluice's Redis scripts. Each script is one file in this
// directory, embedded at build time; its header lists KEYS, ARGV and the
// reply. Callers run them with Run (EVALSHA, falling back to EVAL when the
// server does not have the script) and Load them before use in a pipeline.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed admit.lua
	admitSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed cooldown.lua
	cooldownSrc string
	//go:embed stats.lua
	statsSrc string
	//go:embed room.lua
	roomSrc string
	//go:embed line.lua
	lineSrc string
	//go:embed handover.lua
	handoverSrc string
)

var (
	// Admit decides whether jobs may start, all rules of all scopes at once;
	// on Cluster it also runs the steps of a two-scope admission.
	Admit = redis.NewScript(admitSrc)
	// Renew extends the leases of concurrency slots.
	Renew = redis.NewScript(renewSrc)
	// Cooldown pauses a scope until a time.
	Cooldown = redis.NewScript(cooldownSrc)
	// Stats reads a consistent snapshot of one scope.
	Stats = redis.NewScript(statsSrc)
	// Room keeps the waiting room's due index.
	Room = redis.NewScript(roomSrc)
	// Line puts jobs in their tenant's line in the waiting room.
	Line = redis.NewScript(lineSrc)
	// Handover moves promoted jobs' asynq tasks to the pending list.
	Handover = redis.NewScript(handoverSrc)
)

// All lists every script, for loading them into a server ahead of pipelines.
var All = []*redis.Script{Admit, Renew, Cooldown, Stats, Room, Line, Handover}
