// Package names checks the names sluice's own packages read from their
// callers, job headers, files and command lines: tenants, keys below them,
// shared pools and policies. The rules are throttle's (its tenant.go),
// which every entry point of the limiter applies itself; package throttle,
// which imports this one, sets the checks, so that queue, worker and the
// commands can check a name first (to say which line or flag holds it, or
// to run a job without a bad header) without the checks being part of
// throttle's public API. An error about a tenant or a key wraps
// throttle.ErrInvalidTenant.
package names

// Tenant checks a job's tenant (throttle.Request.Tenant).
var Tenant func(tenant string) error

// Key checks a job's key below its tenant (throttle.Request.Key).
var Key func(key string) error

// Pool checks the name of a shared pool (throttle.Request.Pools).
var Pool func(name string) error

// Policy checks the name a policy is stored under: a tenant, * (the
// default policy), @global, a shared pool, a shadow (throttle.ShadowPrefix
// and a tenant or *) or a key's (TENANT/KEY, TENANT/* or */*).
var Policy func(name string) error
