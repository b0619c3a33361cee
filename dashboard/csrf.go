package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrfCookie holds a random value per browser; a form's token is its HMAC
// under Config.CSRFKey. A page of another site can neither read the cookie
// nor forge the token.
const csrfCookie = "outbox_dashboard_csrf"

// csrfField is the form field that carries the token.
const csrfField = "csrf"

// token returns the CSRF token for r's forms, setting the cookie it is
// tied to on w when r has none.
func (d *Dashboard) token(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && c.Value != "" {
		return d.sign(c.Value)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	v := base64.RawURLEncoding.EncodeToString(b)
	// Secure only over TLS: the dashboard is usually served on plain HTTP
	// on localhost, where a Secure cookie would not come back.
	c := &http.Cookie{Name: csrfCookie, Value: v, Path: d.cfg.Prefix + "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil} //nolint:gosec // Secure depends on TLS, see above
	http.SetCookie(w, c)
	return d.sign(v)
}

func (d *Dashboard) sign(v string) string {
	m := hmac.New(sha256.New, d.cfg.CSRFKey)
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// authorizePost checks that POST r may act, and returns who acts; on
// false it has answered r with 403 and why. In order: Config.Authorize
// must allow r, the request must not come from another origin, and the
// form's token must match the cookie.
func (d *Dashboard) authorizePost(w http.ResponseWriter, r *http.Request) (string, bool) {
	actor, ok := d.actor(r)
	if !ok {
		http.Error(w, "dashboard: read-only: this dashboard has no Config.Authorize, or it refused you", http.StatusForbidden)
		return "", false
	}
	if err := d.origin.Check(r); err != nil {
		http.Error(w, "dashboard: cross-origin request refused: "+err.Error(), http.StatusForbidden)
		return "", false
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" || !hmac.Equal([]byte(r.PostFormValue(csrfField)), []byte(d.sign(c.Value))) {
		http.Error(w, "dashboard: missing or stale CSRF token; reload the page and try again", http.StatusForbidden)
		return "", false
	}
	return actor, true
}

// actor asks Config.Authorize whether r may act.
func (d *Dashboard) actor(r *http.Request) (string, bool) {
	if d.cfg.Authorize == nil {
		return "", false
	}
	actor, ok := d.cfg.Authorize(r)
	if !ok || actor == "" {
		return "", false
	}
	return actor, true
}
