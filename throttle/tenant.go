package throttle

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/names"
)

// The rules for tenant, key, pool and policy names, which every entry
// point applies; sluice's queue, worker and commands reach the checks
// through internal/names, to check a name before it reaches the limiter.
func init() {
	names.Tenant, names.Key, names.Pool, names.Policy = validateTenant, validateKey, validatePool, validatePolicyName
}

// MaxTenantLen is the longest tenant name, in bytes.
const MaxTenantLen = 256

// ErrInvalidTenant is wrapped by the errors for tenants (and keys below
// them, Request.Key) that cannot be used; the error says what is wrong and
// what to do. A tenant is 1 to MaxTenantLen bytes of valid UTF-8 with no
// control character (C0 U+0000–U+001F, DEL U+007F, C1 U+0080–U+009F), not
// one of the policy store's reserved names (* and names starting with @),
// without '/' (which separates a tenant from a key below it:
// "acme/user-42"). A key is 1 to 200 bytes of valid UTF-8 with no control
// character, other than *; it may hold '/'. Every entry point checks them:
// the limiter's verbs, the policy store, policy files, queue.Client, the
// worker's reading of a job's headers and the commands.
var ErrInvalidTenant = errors.New("invalid tenant")

// validateTenant checks a job's tenant (ErrInvalidTenant says the rule).
func validateTenant(tenant string) error {
	switch {
	case tenant == "":
		return fmt.Errorf("%w: the tenant is empty; give the customer, account or user the job is for", ErrInvalidTenant)
	case len(tenant) > MaxTenantLen:
		return fmt.Errorf("%w: tenant %q… is %d bytes; at most %d are allowed (use an id or a hash of the name)", ErrInvalidTenant, tenant[:32], len(tenant), MaxTenantLen)
	case !utf8.ValidString(tenant):
		return fmt.Errorf("%w: tenant %q is not valid UTF-8", ErrInvalidTenant, tenant)
	case controlAt(tenant) >= 0:
		i := controlAt(tenant)
		r, _ := utf8.DecodeRuneInString(tenant[i:])
		return fmt.Errorf("%w: tenant %q has a control character (U+%04X) at byte %d; a tenant is printed in tables and logs, so newlines, tabs, NUL, DEL and other control characters are not allowed", ErrInvalidTenant, tenant, r, i)
	case tenant == DefaultPolicy || strings.HasPrefix(tenant, "@"):
		return fmt.Errorf("%w: tenant %q is a reserved name (* is the default policy, names starting with @ are sluice's); choose another", ErrInvalidTenant, tenant)
	case strings.Contains(tenant, keySep):
		t, k, _ := strings.Cut(tenant, keySep)
		return fmt.Errorf("%w: tenant %q holds %q, which separates a tenant from a key below it: give the tenant %q and the key %q apart (queue.Key, enqueue --key)", ErrInvalidTenant, tenant, keySep, t, k)
	}
	return nil
}

// keySep separates a tenant from a key below it in a policy's name:
// "acme/user-42" is the policy of acme's key user-42, "acme/*" that of
// every key of acme without its own, "*/*" that of every key of every
// tenant without one.
const keySep = "/"

// maxKeyLen is the longest key below a tenant, in bytes.
const maxKeyLen = 200

// validateKey checks a job's key below its tenant (Request.Key): 1 to 200
// bytes of valid UTF-8 with no control character, other than * (which
// names every key in a policy's name). A key may hold '/'
// ("acme/org/repo" is tenant acme's key org/repo).
func validateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty; give the user, project or other part of the tenant the job is for, or no key", ErrInvalidTenant)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%w: key %q… is %d bytes; at most %d are allowed (use an id or a hash of the name)", ErrInvalidTenant, key[:32], len(key), maxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidTenant, key)
	case controlAt(key) >= 0:
		return fmt.Errorf("%w: key %q has a control character at byte %d; a key is printed in tables and logs, so control characters are not allowed", ErrInvalidTenant, key, controlAt(key))
	case key == DefaultPolicy:
		return fmt.Errorf("%w: key %q names every key in a policy's name (\"acme/*\"); a job's key is one of them, choose another", ErrInvalidTenant, key)
	}
	return nil
}

// keyPolicyName is the name of the policy of tenant's key ("acme/user-42").
func keyPolicyName(tenant, key string) string { return tenant + keySep + key }

// keyOf splits a key policy's name: its tenant (or *) and its key (or *);
// false for a name without keySep.
func keyOf(name string) (tenant, key string, ok bool) {
	if strings.HasPrefix(name, "@") {
		return "", "", false
	}
	return strings.Cut(name, keySep)
}

// controlAt returns the byte index of the first control character of s (C0,
// DEL or C1), or -1.
func controlAt(s string) int {
	for i, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return i
		}
	}
	return -1
}

// ShadowPrefix starts the name of a shadow policy: "@shadow:acme" is tried
// on acme's jobs as they start, decided and counted as if it were enforced,
// holding nothing back (the worker's gate records the starts; Stats.Shadow);
// "@shadow:*" is tried on the tenants that follow the default policy and
// have no shadow of their own. A shadow stands beside the enforced policy,
// which keeps working.
const ShadowPrefix = "@shadow:"

// MaxPoolLen is the longest pool name, in bytes, its @ included.
const MaxPoolLen = 64

// validatePool checks the name of a shared pool (Request.Pools): @ and 1
// to 63 lowercase letters, digits, '.', '_' or '-' ("@openai",
// "@smtp-eu"), other than @global and the shadows' names.
func validatePool(name string) error {
	rest, ok := strings.CutPrefix(name, "@")
	switch {
	case !ok:
		return fmt.Errorf("pool %q: a pool's name starts with @ (\"@openai\"); names without it are tenants", name)
	case name == GlobalPolicy:
		return fmt.Errorf("pool %q: @global applies to every job already; name a pool of your own (\"@openai\")", name)
	case strings.HasPrefix(name, ShadowPrefix):
		return fmt.Errorf("pool %q: names starting with %s are shadow policies; name the pool without it", name, ShadowPrefix)
	case rest == "" || len(name) > MaxPoolLen:
		return fmt.Errorf("pool %q: give 1 to %d characters after the @", name, MaxPoolLen-1)
	}
	for i, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("pool %q: %q at byte %d is not allowed; use lowercase letters, digits, '.', '_' and '-'", name, c, i+1)
		}
	}
	return nil
}

// isPool reports whether a policy's (or scope's) name is a pool's.
func isPool(name string) bool {
	return strings.HasPrefix(name, "@") && name != GlobalPolicy && !strings.HasPrefix(name, ShadowPrefix)
}

// validatePolicyName checks the name of a policy: a tenant (see
// validateTenant), * (the default policy), @global, a shared pool (see
// validatePool), ShadowPrefix and a tenant or * (a shadow policy), or a
// key's: TENANT/KEY, TENANT/* (every key of the tenant) or */* (every key
// of every tenant; see keySep).
func validatePolicyName(name string) error {
	if name == DefaultPolicy || name == GlobalPolicy {
		return nil
	}
	if of, ok := strings.CutPrefix(name, ShadowPrefix); ok {
		switch {
		case of == DefaultPolicy:
			return nil
		case of == GlobalPolicy:
			return fmt.Errorf("%w: policy name %q: @global has no shadow (shadows are tried per tenant); try the limit as a tenant's shadow, or as the default's (%s*)", ErrInvalidTenant, name, ShadowPrefix)
		}
		if err := validateTenant(of); err != nil {
			return fmt.Errorf("shadow policy %q: %w", name, err)
		}
		return nil
	}
	if t, k, ok := keyOf(name); ok {
		return validateKeyPolicyName(name, t, k)
	}
	if strings.HasPrefix(name, "@") {
		if err := validatePool(name); err != nil {
			return fmt.Errorf("%w: policy name %q: names starting with @ are @global, shared pools (\"@openai\": lowercase letters, digits, '.', '_', '-') and %sTENANT (a shadow); * is the default policy", ErrInvalidTenant, name, ShadowPrefix)
		}
		return nil
	}
	return validateTenant(name)
}

// validateKeyPolicyName checks a key policy's name: TENANT/KEY, TENANT/*
// or */*.
func validateKeyPolicyName(name, tenant, key string) error {
	if tenant == DefaultPolicy {
		if key != DefaultPolicy {
			return fmt.Errorf("%w: policy name %q: */ names every tenant's keys, so it takes */* (a key of its own needs its tenant: \"acme/%s\")", ErrInvalidTenant, name, key)
		}
		return nil
	}
	if err := validateTenant(tenant); err != nil {
		return fmt.Errorf("key policy %q: %w", name, err)
	}
	if key == DefaultPolicy {
		return nil
	}
	if err := validateKey(key); err != nil {
		return fmt.Errorf("key policy %q: %w", name, err)
	}
	return nil
}

// shadowOf is the tenant (or *) whose shadow the policy name is; false for
// any other name.
func shadowOf(name string) (string, bool) {
	return strings.CutPrefix(name, ShadowPrefix)
}
