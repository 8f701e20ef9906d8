package throttle

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/jobpath"
)

// The calls a job's way through sluice's worker gate and producer makes
// beyond the limiter's public API (redeem, renewAll, checkCost, shadow):
// the worker and queue packages reach them through jobpath.Of; an
// application has no need to.
func init() {
	jobpath.Of = func(l any) any { return jobPath{l.(*Limiter)} }
}

// jobPath is a limiter as a jobpath.Engine.
type jobPath struct{ l *Limiter }

var _ jobpath.Engine[Request, Decision] = jobPath{}

func (p jobPath) Redeem(ctx context.Context, req Request, ticket string) (Decision, bool, error) {
	return p.l.redeem(ctx, req, ticket)
}

func (p jobPath) RenewAll(ctx context.Context, jobs []jobpath.Held) []error {
	return p.l.renewAll(ctx, jobs)
}

func (p jobPath) CheckCost(ctx context.Context, req Request) error {
	return p.l.checkCost(ctx, req)
}

func (p jobPath) Shadow(req Request, at time.Time, counted func(Decision, error)) (end func()) {
	return p.l.shadow(req, at, counted)
}
