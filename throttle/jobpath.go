package throttle

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/jobpath"
)

// The calls a job's way through sluice's worker gate and producer makes
// beyond the limiter's public API (a job's policies resolved once, redeem,
// renewAll, checkCost, shadow): the worker and queue packages reach them
// through jobpath.Of; an application has no need to.
func init() {
	jobpath.Of = func(l any) any { return jobPath{l.(*Limiter)} }
}

// jobPath is a limiter as a jobpath.Engine.
type jobPath struct{ l *Limiter }

var _ jobpath.Engine[Request, Decision, *policiesView] = jobPath{}

// policiesView is how sluice's worker and producer hold a job's policies;
// its Own is the *jobPolicies it is part of.
type policiesView = jobpath.Policies[Policy, LearnedLimit, AdaptiveLimit]

// jobPoliciesOf returns the policies a worker or producer passed (a
// *policiesView from Resolve, or the limiter's own *jobPolicies) in the
// limiter's own form; nil for none.
func jobPoliciesOf(v any) *jobPolicies {
	switch p := v.(type) {
	case *jobPolicies:
		return p
	case *policiesView:
		if p != nil {
			own, _ := p.Own.(*jobPolicies)
			return own
		}
	}
	return nil
}

func (p jobPath) Resolve(ctx context.Context, tenant string) (*policiesView, error) {
	r, err := p.l.policies.policiesFor(ctx, tenant)
	if err != nil {
		return nil, err
	}
	r.Own = &r
	return &r.policiesView, nil
}

func (p jobPath) With(req Request, v *policiesView) Request {
	req.policies = jobPoliciesOf(v)
	return req
}

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
