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

// ValidatePolicyName checks the name of a policy: a tenant (see
// ValidateTenant), * (the default policy) or @global.
func ValidatePolicyName(name string) error {
	if name == DefaultPolicy || name == GlobalPolicy {
		return nil
	}
	if strings.HasPrefix(name, "@") {
		return fmt.Errorf("%w: policy name %q: the only names starting with @ are @global; * is the default policy", ErrInvalidTenant, name)
	}
	return ValidateTenant(name)
}
