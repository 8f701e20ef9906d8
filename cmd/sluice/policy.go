package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/throttle"
)

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

func policySet(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 1, -1, "TENANT"); err != nil {
		return err
	}
	if len(args) < 2 {
		return usagef(c, "policy set: missing RULES (quote them: sluice policy set %s 'rate=100/s burst=20'; '' for no limits)", args[0])
	}
	name, err := policyNameOf(c, args[0], o.shadow)
	if err != nil {
		return err
	}
	// The rules may come as one quoted argument or as several.
	text := strings.Join(args[1:], " ")
	p, err := throttle.ParsePolicy(text)
	if err != nil {
		return usagef(c, "policy set %s: %v", name, err)
	}
	of, shadow := strings.CutPrefix(name, throttle.ShadowPrefix)
	if shadow && !p.HasRules() {
		return usagef(c, "policy set %s --shadow: a shadow policy needs at least one rule (rate, window, quota or concurrency) to try, e.g. sluice policy set %s 'rate=5/s' --shadow; nothing was changed", shellQuote(of), shellQuote(of))
	}
	if strings.Count(" "+text, " rate=") > len(p.Rates) {
		fmt.Fprintln(a.stderr, "sluice: note: a rate given twice is one rule; it is kept once")
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	old, oldErr := cn.store.Get(a.ctx, name)
	if err := cn.store.Set(a.ctx, name, p); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "set policy %s: %s\n", name, describeRules(p))
	switch {
	case oldErr == nil && old.String() != p.String():
		fmt.Fprintf(a.stdout, "  was: %s\n", describeRules(old))
	case oldErr == nil:
		fmt.Fprintln(a.stdout, "  (unchanged)")
	}
	if shadow {
		whose := shellQuote(of) + "'s jobs"
		if of == throttle.DefaultPolicy {
			whose = "the jobs of the tenants that follow the default policy *"
		}
		stats := "sluice stats " + shellQuote(of)
		if of == throttle.DefaultPolicy {
			stats = "sluice stats"
		}
		fmt.Fprintf(a.stdout, "  a shadow: tried on %s as they start and counted, not enforced; see what it would deny with: %s\n", whose, stats)
	}
	return nil
}

// policyNameOf is the name of the policy a command names: the tenant's (or
// * or @global), or with shadow the tenant's shadow (ShadowPrefix+tenant).
func policyNameOf(c *command, name string, shadow bool) (string, error) {
	if shadow {
		switch {
		case strings.HasPrefix(name, throttle.ShadowPrefix):
			// named in full already
		case name == throttle.GlobalPolicy:
			return "", usagef(c, "@global has no shadow policy: shadows are tried per tenant; give a tenant, or * for the tenants that follow the default policy")
		default:
			name = throttle.ShadowPrefix + name
		}
	}
	if err := checkPolicyName(c, name); err != nil {
		return "", err
	}
	return name, nil
}

func describeRules(p *throttle.Policy) string {
	if s := p.String(); s != "" {
		return s
	}
	return "(no rules: nothing is limited)"
}

func policyGet(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 1, 1, "TENANT"); err != nil {
		return err
	}
	name, err := policyNameOf(c, args[0], o.shadow)
	if err != nil {
		return err
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	p, err := cn.store.Get(a.ctx, name)
	if of, shadow := strings.CutPrefix(name, throttle.ShadowPrefix); shadow && errors.Is(err, throttle.ErrNoPolicy) {
		return noShadowError(a, cn, of)
	}
	if errors.Is(err, throttle.ErrNoPolicy) {
		if name == throttle.DefaultPolicy || name == throttle.GlobalPolicy {
			return fmt.Errorf("no policy %s; set one with: sluice policy set '%s' 'RULES'", name, name)
		}
		def, derr := cn.store.Get(a.ctx, throttle.DefaultPolicy)
		switch {
		case derr == nil:
			return fmt.Errorf("no policy for %q; it follows the default policy *: %s", name, describeRules(def))
		case errors.Is(derr, throttle.ErrNoPolicy):
			return fmt.Errorf("no policy for %q and no default policy *: its jobs are limited by @global only; set one with: sluice policy set %s 'RULES'", name, shellQuote(name))
		}
		return derr
	}
	if err != nil {
		return err
	}
	if o.json {
		of, _ := strings.CutPrefix(name, throttle.ShadowPrefix)
		if of == name {
			of = ""
		}
		return writeJSON(a.stdout, listEntry{Name: name, Policy: p.String(), ShadowOf: of})
	}
	fmt.Fprintln(a.stdout, p.String())
	return nil
}

// noShadowError says that tenant (or *) has no shadow policy of its own,
// and which one it is tried under instead, if any.
func noShadowError(a *app, cn *conn, of string) error {
	set := fmt.Sprintf("set one with: sluice policy set %s 'RULES' --shadow", shellQuote(of))
	if of == throttle.DefaultPolicy {
		return fmt.Errorf("no shadow policy of the default policy *; %s", set)
	}
	r, err := cn.resolve(a.ctx, of)
	if err != nil {
		return err
	}
	if r.Shadow != nil {
		return fmt.Errorf("no shadow policy for %q of its own; it follows the default policy *, whose shadow is tried on its jobs: %s; %s", of, describeRules(r.Shadow), set)
	}
	return fmt.Errorf("no shadow policy for %q; %s", of, set)
}

// listEntry is one policy in `policy list --json`.
type listEntry struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	// ShadowOf is the tenant (or *) whose shadow policy this is.
	ShadowOf string `json:"shadow_of,omitempty"`
	Error    string `json:"error,omitempty"`
	// NameError says why Name is not a valid policy name (a policy stored
	// by an older version or by a writer that bypassed sluice).
	NameError string `json:"name_error,omitempty"`
}

// nameError says why a stored policy's name is not one sluice accepts;
// "" when it is.
func nameError(name string) string {
	if err := names.Policy(name); err != nil {
		return err.Error()
	}
	return ""
}

func policyList(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 0, ""); err != nil {
		return err
	}
	cn, list, err := a.listPolicies(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	if o.shadow {
		shadows := list[:0]
		for _, np := range list {
			if strings.HasPrefix(np.Name, throttle.ShadowPrefix) {
				shadows = append(shadows, np)
			}
		}
		list = shadows
	}
	if o.json {
		out := make([]listEntry, 0, len(list))
		for _, np := range list {
			e := listEntry{Name: np.Name, NameError: nameError(np.Name)}
			if of, ok := strings.CutPrefix(np.Name, throttle.ShadowPrefix); ok {
				e.ShadowOf = of
			}
			if np.Err != nil {
				e.Error = np.Err.Error()
			} else {
				e.Policy = np.Policy.String()
			}
			out = append(out, e)
		}
		return writeJSON(a.stdout, out)
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "NAME\tPOLICY")
	invalid := 0
	for _, np := range list {
		text := ""
		if np.Err != nil {
			text = "UNREADABLE: " + human.Line(np.Err.Error(), 0)
		} else {
			text = describeRules(np.Policy)
		}
		if nameError(np.Name) != "" {
			invalid++
			text += "  (INVALID NAME)"
		}
		fmt.Fprintf(tw, "%s\t%s\n", human.Text(np.Name), text)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(list) == 0 && o.shadow:
		fmt.Fprintln(a.stderr, "no shadow policies; try one with: sluice policy set TENANT 'RULES' --shadow")
	case len(list) == 0:
		fmt.Fprintln(a.stderr, "no policies yet; set one with: sluice policy set TENANT 'RULES'")
	}
	if invalid > 0 {
		fmt.Fprintf(a.stderr, "%d %s a name that is not a valid tenant (shown quoted, with escapes); no job can use %s; remove %s with: sluice policy delete --invalid\n",
			invalid, plural(invalid, "policy has", "policies have"), plural(invalid, "it", "them"), plural(invalid, "it", "them"))
	}
	return nil
}

// plural picks one or many by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func policyDelete(a *app, c *command, o *opts, args []string) error {
	if o.invalid {
		if len(args) > 0 || o.shadow {
			return usagef(c, "policy delete: give TENANT (with --shadow for its shadow) or --invalid, not both")
		}
		return policyDeleteInvalid(a, c)
	}
	if err := wantArgs(c, args, 1, 1, "TENANT"); err != nil {
		return err
	}
	name, err := policyNameOf(c, args[0], o.shadow)
	if err != nil {
		return err
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	existed, err := cn.store.Delete(a.ctx, name)
	if err != nil {
		return err
	}
	of, shadow := strings.CutPrefix(name, throttle.ShadowPrefix)
	switch {
	case existed && shadow:
		fmt.Fprintf(a.stdout, "deleted policy %s (the shadow of %s; its enforced policy is unchanged)\n", name, of)
	case existed:
		fmt.Fprintf(a.stdout, "deleted policy %s (its throttle state is kept)\n", name)
	default:
		fmt.Fprintf(a.stdout, "no policy %s; nothing deleted\n", name)
	}
	return nil
}

// policyDeleteInvalid deletes every stored policy whose name sluice would
// refuse today (a control character, say): such a name cannot be typed, or
// not safely, on a command line.
func policyDeleteInvalid(a *app, c *command) error {
	cn, list, err := a.listPolicies(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	n := 0
	for _, np := range list {
		why := nameError(np.Name)
		if why == "" {
			continue
		}
		if _, err := cn.store.Delete(a.ctx, np.Name); err != nil {
			return err
		}
		n++
		fmt.Fprintf(a.stdout, "deleted policy %s (%s)\n", human.Text(np.Name), why)
	}
	if n == 0 {
		fmt.Fprintln(a.stdout, "no policy has an invalid name; nothing deleted")
	}
	return nil
}

func policyApply(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 0, ""); err != nil {
		return err
	}
	if o.file == "" {
		return usagef(c, "policy apply: missing -f FILE.yaml (- reads standard input)")
	}
	var (
		data []byte
		err  error
	)
	if o.file == "-" {
		data, err = io.ReadAll(a.stdin)
	} else {
		data, err = os.ReadFile(o.file)
	}
	if err != nil {
		return fmt.Errorf("cannot read the policy file %s: %v", o.file, unwrapPath(err))
	}
	policies, err := throttle.ParsePolicyFile(data)
	if err != nil {
		return fmt.Errorf("%s: %v; nothing was changed", o.file, err)
	}
	if len(policies) == 0 && o.prune {
		return fmt.Errorf("%s lists no policies: with --prune that would delete every policy; nothing was changed (delete them one by one with sluice policy delete)", o.file)
	}
	cn, existing, err := a.listPolicies(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	before := map[string]throttle.NamedPolicy{}
	for _, np := range existing {
		before[np.Name] = np
	}
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	sort.Strings(names)

	var created, updated, unchanged, deleted, kept int
	tw := newTable(a.stdout)
	for _, n := range names {
		p := policies[n]
		old, ok := before[n]
		switch {
		case !ok:
			created++
			fmt.Fprintf(tw, "created\t%s\t%s\n", n, describeRules(p))
		case old.Err == nil && old.Policy.String() == p.String():
			unchanged++
			fmt.Fprintf(tw, "unchanged\t%s\t%s\n", n, describeRules(p))
		default:
			updated++
			was := "unreadable"
			if old.Err == nil {
				was = describeRules(old.Policy)
			}
			fmt.Fprintf(tw, "updated\t%s\t%s (was: %s)\n", n, describeRules(p), was)
		}
	}
	for _, np := range existing {
		if _, ok := policies[np.Name]; ok {
			continue
		}
		if o.prune {
			deleted++
			fmt.Fprintf(tw, "deleted\t%s\t\n", human.Text(np.Name))
		} else {
			kept++
		}
	}
	if !o.dryRun {
		if err := cn.store.Apply(a.ctx, policies, o.prune); err != nil {
			return fmt.Errorf("apply %s: %w; nothing was changed", o.file, err)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%d created, %d updated, %d unchanged", created, updated, unchanged)
	if o.prune {
		summary += fmt.Sprintf(", %d deleted", deleted)
	} else if kept > 0 {
		summary += fmt.Sprintf("; %d other policies kept (--prune deletes them)", kept)
	}
	if o.dryRun {
		fmt.Fprintf(a.stdout, "dry run, nothing was changed: %s would be %s\n", o.file, summary)
	} else {
		fmt.Fprintf(a.stdout, "applied %s: %s\n", o.file, summary)
	}
	return nil
}

// listPolicies connects and reads every stored policy; the caller closes
// the connection.
func (a *app) listPolicies(c *command) (*conn, []throttle.NamedPolicy, error) {
	cn, err := a.connect(c)
	if err != nil {
		return nil, nil, err
	}
	list, err := cn.store.List(a.ctx)
	if err != nil {
		cn.Close()
		return nil, nil, err
	}
	return cn, list, nil
}

// unwrapPath drops the "open FILE:" part the caller already says.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// shellQuote quotes s for a command line users can paste.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
