package worker

import "time"

// RecordEvery is recordEvery, for the recoverer's tests.
const RecordEvery = recordEvery

// SetLinger sets how long the gate's releases of jobs of tenants far from
// their caps wait for company (releaseLinger).
func SetLinger(g *Gate, d time.Duration) { g.linger = d }

// KnownCapacity is the fleet's capacity for queue as the gate's pump last
// read it.
func KnownCapacity(g *Gate, queue string) int { return g.gauge.Known(queue) }
