package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// authEnv is the environment variable that gives the dashboard's
// credential when --auth-file does not.
const authEnv = "SLUICE_DASHBOARD_AUTH"

// credential is what every request to the dashboard must carry, but
// /healthz's: USER:PASSWORD asks for HTTP basic auth with them; a value
// with no colon is a token, sent as "Authorization: Bearer TOKEN" or as
// basic auth's password (any user), so that a browser can send it too.
type credential struct {
	user   string // "" for a token
	secret string
}

// loadCredential reads the credential of --auth-file, else of
// SLUICE_DASHBOARD_AUTH; nil when neither gives one.
func loadCredential(file string, env func(string) string) (*credential, error) {
	value, source := env(authEnv), authEnv
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--auth-file %s: %v", file, unwrapPath(err))
		}
		value, source = string(b), "--auth-file "+file
	}
	value = strings.TrimRight(value, "\r\n")
	if value == "" {
		if file != "" {
			return nil, fmt.Errorf("%s: empty; write USER:PASSWORD (basic auth) or a token on one line", source)
		}
		return nil, nil
	}
	if strings.ContainsAny(value, "\r\n") {
		return nil, fmt.Errorf("%s: more than one line; write USER:PASSWORD (basic auth) or a token on one line", source)
	}
	c := &credential{secret: value}
	if user, pass, ok := strings.Cut(value, ":"); ok {
		if user == "" || pass == "" {
			return nil, fmt.Errorf("%s: USER:PASSWORD with an empty user or password; give both, or a token with no colon", source)
		}
		c.user, c.secret = user, pass
	}
	if len(c.secret) < 8 {
		return nil, fmt.Errorf("%s: a password or token of %d characters; use at least 8 (e.g. openssl rand -hex 16)", source, len(c.secret))
	}
	return c, nil
}

// allows reports whether r carries the credential.
func (c *credential) allows(r *http.Request) bool {
	if user, pass, ok := r.BasicAuth(); ok {
		return (c.user == "" || equal(user, c.user)) && equal(pass, c.secret)
	}
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && c.user == "" {
		return equal(token, c.secret)
	}
	return false
}

// equal compares in constant time (of the hashes: the lengths stay hidden).
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// guard asks every request but GET /healthz for the credential.
func (c *credential) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || c.allows(r) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="sluice dashboard", charset="UTF-8"`)
		http.Error(w, "the dashboard asks for its credential (--auth-file or "+authEnv+")", http.StatusUnauthorized)
	})
}
