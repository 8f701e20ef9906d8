package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/throttle"
)

// dryRunID is the job id of `admit --dry-run` without --id: a job that
// holds no slot and no reservation.
const dryRunID = "sluice-cli-dry-run"

// admitJSON is the output of `admit --json`.
type admitJSON struct {
	Tenant  string `json:"tenant"`
	Cost    int64  `json:"cost"`
	Allowed bool   `json:"allowed"`
	// Policy is the name of the tenant's policy (its own or "*"), Rules its text.
	Policy string `json:"policy"`
	Rules  string `json:"rules"`
	// DeniedBy names the rule that denied the job; null when allowed.
	DeniedBy     *deniedJSON `json:"denied_by"`
	RetryAfterMS float64     `json:"retry_after_ms"`
	Remaining    int64       `json:"remaining"`
	ResetAfterMS float64     `json:"reset_after_ms"`
	InFlight     int64       `json:"in_flight"`
	Reserved     bool        `json:"reserved"`
	Slot         *time.Time  `json:"slot"`
	Now          time.Time   `json:"now"`
}

func admit(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 1, 1, "TENANT"); err != nil {
		return err
	}
	tenant := args[0]
	if err := names.Tenant(tenant); err != nil {
		return usagef(c, "%v", err)
	}
	if !o.dryRun {
		return usagef(c, "admit needs --dry-run: it only asks whether a job would be admitted and changes nothing (workers admit jobs for real)")
	}
	if o.cost < 1 {
		return usagef(c, "--cost %d: must be at least 1", o.cost)
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	id := o.id
	if id == "" {
		id = dryRunID
	}
	d, err := cn.limiter.Do(a.ctx, throttle.Request{Tenant: tenant, ID: id, Cost: o.cost, DryRun: true})
	var ce *throttle.CostError
	if errors.As(err, &ce) {
		return ce
	}
	if err != nil {
		return err
	}
	r, err := cn.resolve(a.ctx, tenant)
	if err != nil {
		return err
	}
	own, ownName, global := r.Policy, r.Name, r.Global
	policy := own
	if d.Policy == throttle.GlobalPolicy {
		policy = global
	}
	ruleText := explainRule(policy, d)
	if l := r.Learned; l != nil && l.Rule != "" && l.Rule == d.Rule && d.Policy != throttle.GlobalPolicy {
		ruleText += " (learned from the downstream)"
	}
	var concLimit int64 = -1
	if own != nil && own.Concurrency != nil {
		concLimit = own.Concurrency.Limit
	}

	if o.json {
		j := admitJSON{
			Tenant: tenant, Cost: o.cost, Allowed: d.Allowed, Policy: ownName, Rules: own.String(),
			RetryAfterMS: ms(d.RetryAfter), Remaining: d.Remaining, ResetAfterMS: ms(d.ResetAfter), InFlight: d.InFlight,
			Reserved: d.Reserved, Slot: timePtr(d.Slot), Now: d.Now.UTC(),
		}
		if d.Allowed {
			j.RetryAfterMS = -1
		} else {
			j.DeniedBy = &deniedJSON{Policy: d.Policy, Rule: d.Rule, Text: ruleText}
		}
		if d.ResetAfter < 0 {
			j.ResetAfterMS = -1
		}
		if err := writeJSON(a.stdout, j); err != nil {
			return err
		}
		return deniedUnless(d.Allowed)
	}

	tw := newTable(a.stdout)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "  %s\t%s\n", k, fmt.Sprintf(format, args...)) }
	job := "a job"
	if o.cost > 1 {
		job = fmt.Sprintf("a job of cost %d", o.cost)
	}
	if d.Allowed {
		fmt.Fprintf(tw, "%s of %s would be admitted now\n", job, tenant)
	} else {
		fmt.Fprintf(tw, "%s of %s would NOT be admitted now\n", job, tenant)
		row("denied by", "%s", ruleText)
		row("retry after", "%s", short(d.RetryAfter))
	}
	switch {
	case ownName == "":
		row("policy", "none of its own and no default *")
	case ownName == throttle.DefaultPolicy:
		row("policy", "* (the default): %s", describeRules(own))
	default:
		row("policy", "%s: %s", ownName, describeRules(own))
	}
	if global.HasRules() {
		row("@global", "%s", global.String())
	}
	if l := r.Learned; l != nil {
		row("learned", "%s", l.String())
	}
	if d.Remaining >= 0 {
		row("remaining", "%s of cost 1 right now", human.Count(d.Remaining, "more job", "more jobs"))
	}
	switch {
	case d.ResetAfter > 0:
		row("full again", "in %s if nothing else starts", short(d.ResetAfter))
	case d.ResetAfter == 0:
		row("full again", "now: nothing is in use")
	}
	if d.InFlight >= 0 {
		if concLimit > 0 {
			row("in flight", "%d of %d", d.InFlight, concLimit)
		} else {
			row("in flight", "%d", d.InFlight)
		}
	}
	if d.Reserved {
		row("reserved", "job %s holds the slot at %s (in %s)", human.Text(id), d.Slot.UTC().Format(time.RFC3339Nano), short(d.Slot.Sub(d.Now)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return deniedUnless(d.Allowed)
}

// deniedUnless is admit's exit: 0 when the job would be admitted, 3 when
// not.
func deniedUnless(allowed bool) error {
	if allowed {
		return nil
	}
	return errDenied
}

type deniedJSON struct {
	Policy string `json:"policy"`
	Rule   string `json:"rule"`
	Text   string `json:"text"`
}

// explainRule names the rule that decided and prints it: "rate[0] of
// policy acme (100/s burst 20)".
func explainRule(p *throttle.Policy, d throttle.Decision) string {
	if d.Allowed || d.Rule == "" {
		return ""
	}
	detail := ""
	switch {
	case strings.HasPrefix(d.Rule, "rate["):
		var i int
		if _, err := fmt.Sscanf(d.Rule, "rate[%d]", &i); err == nil && p != nil && i >= 0 && i < len(p.Rates) {
			detail = p.Rates[i].String()
		}
	case d.Rule == "window" && p != nil && p.Window != nil:
		detail = p.Window.String() + " sliding window"
	case d.Rule == "quota" && p != nil && p.Quota != nil:
		detail = p.Quota.String()
	case d.Rule == "concurrency" && p != nil && p.Concurrency != nil:
		detail = fmt.Sprintf("at most %d running at once", p.Concurrency.Limit)
	case d.Rule == "cooldown":
		detail = "paused after a handler reported the downstream saturated"
	case d.Rule == "reserved":
		detail = "the job's reserved slot is not due yet"
	case d.Rule == "backlog":
		detail = "too many queued or deferred jobs"
	}
	s := d.Rule
	if d.Policy != "" {
		s += " of policy " + d.Policy
	}
	if detail != "" {
		s += " (" + detail + ")"
	}
	return s
}
