// Package lua holds sluice's Redis scripts. Each script is one file in this
// directory, embedded at build time; its header lists KEYS, ARGV and the
// reply. Callers run them with Run (EVALSHA, falling back to EVAL when the
// server does not have the script) and Load them before use in a pipeline.
package lua

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed admit.lua
	admitSrc string
	//go:embed release.lua
	releaseSrc string
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
	//go:embed capacity.lua
	capacitySrc string
	//go:embed fleet.lua
	fleetSrc string
	//go:embed recover.lua
	recoverSrc string
	//go:embed repark.lua
	reparkSrc string
	//go:embed clock.lua
	clockSrc string
	//go:embed slot.lua
	slotSrc string
	//go:embed proto.lua
	protoSrc string
	//go:embed wait.lua
	waitSrc string
	//go:embed prioritize.lua
	prioritizeSrc string
	//go:embed phases.lua
	phasesSrc string
	//go:embed rate.lua
	rateSrc string
	//go:embed window.lua
	windowSrc string
	//go:embed quota.lua
	quotaSrc string
	//go:embed concurrency.lua
	concurrencySrc string
	//go:embed twostep.lua
	twostepSrc string
	//go:embed roomops.lua
	roomopsSrc string
	//go:embed quick.lua
	quickSrc string
	//go:embed adapt.lua
	adaptSrc string
	//go:embed settle.lua
	settleSrc string
	//go:embed forward.lua
	forwardSrc string
	//go:embed block.lua
	blockSrc string
	//go:embed expire.lua
	expireSrc string
	//go:embed park.lua
	parkSrc string
)

// admitScript is admit.lua with its parts: the rule kinds' functions, the
// phases, the two-scope steps, the waiting room's ops and the quick path,
// each a file of its own, and the pieces it shares with other scripts.
func admitScript() string {
	s := admitSrc
	for _, p := range []struct{ name, src string }{
		{"window", windowSrc}, {"quota", quotaSrc}, {"concurrency", concurrencySrc},
		{"rate", rateSrc}, {"phases", phasesSrc}, {"twostep", twostepSrc}, {"roomops", roomopsSrc}, {"quick", quickSrc},
		{"clock", clockSrc}, {"slot", slotSrc}, {"release_slot", releaseSrc}, {"varint", protoSrc}, {"move_task", handoverSrc},
	} {
		s = include(s, p.src, p.name)
	}
	return s
}

var (
	// Admit decides whether jobs may start, all rules of all scopes at once;
	// on Cluster it also runs the steps of a two-scope admission.
	Admit = redis.NewScript(admitScript())
	// Release gives back concurrency slots, or says that jobs wait for
	// them (admit.lua's release op then hands them on).
	Release = redis.NewScript(include(include(releaseSrc, clockSrc, "clock"), slotSrc, "slot"))
	// Renew extends the leases of concurrency slots.
	Renew = redis.NewScript(include(include(renewSrc, clockSrc, "clock"), slotSrc, "slot"))
	// Cooldown pauses a scope until a time.
	Cooldown = redis.NewScript(include(cooldownSrc, clockSrc, "clock"))
	// Stats reads a consistent snapshot of one scope.
	Stats = redis.NewScript(include(include(statsSrc, clockSrc, "clock"), slotSrc, "slot"))
	// Room keeps the waiting room's due index.
	Room = redis.NewScript(roomSrc)
	// Line puts jobs in their tenant's line in the waiting room.
	Line = redis.NewScript(lineSrc)
	// Handover moves promoted jobs' asynq tasks to the pending list.
	Handover = redis.NewScript(include(handoverSrc, protoSrc, "varint"))
	// Capacity keeps the registry of the fleet's capacity.
	Capacity = redis.NewScript(capacitySrc)
	// Fleet keeps the registry of the fleet's worker processes and the
	// recoverer's lock.
	Fleet = redis.NewScript(fleetSrc)
	// Recover gives asynq tasks nobody runs back to their pending list.
	Recover = redis.NewScript(recoverSrc)
	// Wait records a new job that is to wait in its line, when the fleet
	// has no room for it (admit.lua's arrive op, without the decision).
	Wait = redis.NewScript(include(waitSrc, clockSrc, "clock"))
	// Park parks a new job's asynq task and puts the job in its line in one
	// run, when the fleet has no room for it (wait.lua, asynq's schedule
	// and line.lua at once, on one server).
	Park = redis.NewScript(include(parkSrc, clockSrc, "clock"))
	// Prioritize moves a waiting job to another priority level of its line.
	Prioritize = redis.NewScript(prioritizeSrc)
	// Repark pushes the fallback of the waiting room's parked asynq tasks
	// further out.
	Repark = redis.NewScript(include(reparkSrc, protoSrc, "varint"))
	// Adapt takes one step of a tenant's adaptive limit.
	Adapt = redis.NewScript(include(adaptSrc, clockSrc, "clock"))
	// Settle moves a finished job's charges from its estimated cost to its
	// actual cost.
	Settle = redis.NewScript(include(include(settleSrc, clockSrc, "clock"), expireSrc, "expire"))
	// Forward moves a queue's due scheduled and retried asynq tasks to its
	// pending list, as asynq's forwarder does.
	Forward = redis.NewScript(forwardSrc)
	// Block grants, renews and takes back blocks of starts and slots.
	Block = redis.NewScript(include(include(include(blockSrc, clockSrc, "clock"), slotSrc, "slot"), expireSrc, "expire"))
)

// All lists every script, for loading them into a server ahead of pipelines.
var All = []*redis.Script{Admit, Release, Renew, Cooldown, Stats, Room, Line, Handover, Capacity, Fleet, Recover, Repark, Prioritize, Adapt, Wait, Park, Settle, Forward, Block}

// include puts the part of from between "-- @begin NAME" and "-- @end NAME"
// into src at the line "-- @include NAME": a piece scripts share is written
// once (clock.lua's clock in every script that decides by the time,
// slot.lua's slot in every script that reads slots, release.lua's release
// of a slot in admit.lua too).
func include(src, from, name string) string {
	begin, end := "-- @begin "+name, "-- @end "+name
	i, j := strings.Index(from, begin), strings.Index(from, end)
	at := strings.Index(src, "-- @include "+name)
	if i < 0 || j < i || at < 0 {
		panic("lua: cannot include " + name)
	}
	piece := from[i:j]
	eol := strings.IndexByte(src[at:], '\n')
	return src[:at] + piece + src[at+eol+1:]
}
