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

// ValidateTenant checks a job's tenant: 1 to 256 bytes of UTF-8, not one of
// the policy store's reserved names (* and names starting with @).
func ValidateTenant(tenant string) error {
	switch {
	case tenant == "":
		return fmt.Errorf("%w: the tenant is empty; give the customer, account or user the job is for", ErrInvalidTenant)
	case len(tenant) > MaxTenantLen:
		return fmt.Errorf("%w: tenant %q… is %d bytes; at most %d are allowed (use an id or a hash of the name)", ErrInvalidTenant, tenant[:32], len(tenant), MaxTenantLen)
	case !utf8.ValidString(tenant):
		return fmt.Errorf("%w: tenant %q is not valid UTF-8", ErrInvalidTenant, tenant)
	case tenant == DefaultPolicy || strings.HasPrefix(tenant, "@"):
		return fmt.Errorf("%w: tenant %q is a reserved name (* is the default policy, names starting with @ are sluice's); choose another", ErrInvalidTenant, tenant)
	}
	return nil
}

// validatePolicyName accepts a tenant, * or @global as the name of a policy.
func validatePolicyName(name string) error {
	if name == DefaultPolicy || name == GlobalPolicy {
		return nil
	}
	if strings.HasPrefix(name, "@") {
		return fmt.Errorf("%w: policy name %q: the only reserved names are * (default) and @global", ErrInvalidTenant, name)
	}
	return ValidateTenant(name)
}
