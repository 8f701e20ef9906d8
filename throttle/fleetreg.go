package throttle

import "github.com/sluicehq/sluice/internal/fleet"

// The registry of the fleet's worker processes under the limiter's prefix:
// the worker package's recoverer reaches it through fleet.Of; an
// application has no need to.
func init() {
	fleet.Of = func(l any) *fleet.Registry {
		lim := l.(*Limiter)
		return fleet.New(lim.client, lim.cfg.Prefix)
	}
}
