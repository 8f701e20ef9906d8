// Package policylang names the words of sluice's policy language: the
// options of a policy's text form and the forms a policy's name takes.
// Package throttle's parser is held to these lists by its tests, and the
// texts that teach the language (sluice help, the README) by theirs, so
// that an option or a form the parser gains fails a test until the help
// names it.
package policylang

// Options are the options of a policy's text form, in the order
// throttle.Policy.String prints them: the rule kinds' (each kind's own
// option first), then the policy's own.
var Options = []string{
	"rate", "burst",
	"window",
	"quota", "reset", "tz",
	"concurrency", "lease",
	"overflow", "max_wait", "backlog", "weight", "shape", "fail_open", "learn",
	"adapt", "adapt_step", "adapt_every", "adapt_latency",
}

// A Scope is a form of a policy's name: what the policy applies to.
type Scope struct {
	// Form is the name as help writes it: TENANT/KEY, @NAME.
	Form string
	// Example is a name of the form: acme/user-42, @openai.
	Example string
}

// Scopes are the forms of a policy's name.
var Scopes = []Scope{
	{"TENANT", "acme"},
	{"*", "*"},
	{"TENANT/KEY", "acme/user-42"},
	{"TENANT/*", "acme/*"},
	{"*/*", "*/*"},
	{"@global", "@global"},
	{"@NAME", "@openai"},
	{"@shadow:TENANT", "@shadow:acme"},
	{"@shadow:*", "@shadow:*"},
}
