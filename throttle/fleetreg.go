package throttle

import "github.com/sluicehq/sluice/internal/fleet"

// Fleet returns the registry of the fleet's worker processes under the
// limiter's prefix: the worker package's recoverer uses it (see package
// worker); an application has no need to.
func (l *Limiter) Fleet() *fleet.Registry { return fleet.New(l.client, l.cfg.Prefix) }
