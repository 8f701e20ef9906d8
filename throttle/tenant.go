package throttle

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The rule for tenant names, which every entry point applies.

// MaxTenantLen is the longest tenant name, in bytes.
const MaxTenantLen = 256

// ErrInvalidTenant is wrapped by the errors for tenant names that cannot be used.
var ErrInvalidTenant = errors.New("invalid tenant")

// ValidateTenant checks a job's tenant: 1 to 256 bytes of valid UTF-8 with
// no control character (C0 U+0000–U+001F, DEL U+007F, C1 U+0080–U+009F),
// not one of the policy store's reserved names (* and names starting with
// @). Every entry point applies it: the CLI, policy files, queue.Client and
// the worker's reading of a job's tenant header.
func ValidateTenant(tenant string) error {
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
	}
	return nil
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
// holding nothing back (Limiter.Shadow, Stats.Shadow); "@shadow:*" is tried
// on the tenants that follow the default policy and have no shadow of their
// own. A shadow stands beside the enforced policy, which keeps working.
const ShadowPrefix = "@shadow:"

// MaxPoolLen is the longest pool name, in bytes, its @ included.
const MaxPoolLen = 64

// ValidatePool checks the name of a shared pool (Request.Pools): @ and 1
// to 63 lowercase letters, digits, '.', '_' or '-' ("@openai",
// "@smtp-eu"), other than @global and the shadows' names.
func ValidatePool(name string) error {
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

// ValidatePolicyName checks the name of a policy: a tenant (see
// ValidateTenant), * (the default policy), @global, a shared pool (see
// ValidatePool), or ShadowPrefix and a tenant or * (a shadow policy).
func ValidatePolicyName(name string) error {
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
		if err := ValidateTenant(of); err != nil {
			return fmt.Errorf("shadow policy %q: %w", name, err)
		}
		return nil
	}
	if strings.HasPrefix(name, "@") {
		if err := ValidatePool(name); err != nil {
			return fmt.Errorf("%w: policy name %q: names starting with @ are @global, shared pools (\"@openai\": lowercase letters, digits, '.', '_', '-') and %sTENANT (a shadow); * is the default policy", ErrInvalidTenant, name, ShadowPrefix)
		}
		return nil
	}
	return ValidateTenant(name)
}

// shadowOf is the tenant (or *) whose shadow the policy name is; false for
// any other name.
func shadowOf(name string) (string, bool) {
	return strings.CutPrefix(name, ShadowPrefix)
}
