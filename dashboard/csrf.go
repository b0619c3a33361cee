package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// csrfCookie holds a random value per browser; a form's token is its HMAC
// under [Config.CSRFKey]. A page of another site can neither read the cookie
// nor forge the token.
const csrfCookie = "outbox_dashboard_csrf"

// csrfField is the form field that carries the token.
const csrfField = "csrf"

// tokenTTL is how long a form's token is good for: a confirmation left
// open longer must be reloaded.
const tokenTTL = time.Hour

// token returns a CSRF token for r's forms, setting the cookie it is tied
// to on w when r has none. A token binds the cookie, the actor
// [Config.Authorize] names for r, the time it was issued and a random form
// id: it is refused for another browser, another actor, after tokenTTL,
// and (see submitOnce) a second time.
func (d *Dashboard) token(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if c, err := r.Cookie(csrfCookie); err == nil && c.Value != "" {
		v = c.Value
	} else {
		v = randomText(32)
		// Secure only over TLS: the dashboard is usually served on plain HTTP
		// on localhost, where a Secure cookie would not come back.
		c := &http.Cookie{Name: csrfCookie, Value: v, Path: d.cfg.Prefix + "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil} //nolint:gosec // Secure depends on TLS, see above
		http.SetCookie(w, c)
	}
	actor, _ := d.actor(r)
	issued := strconv.FormatInt(time.Now().Unix(), 10)
	form := randomText(12)
	return issued + "." + form + "." + d.sign(v, actor, issued, form)
}

// randomText is n random bytes, base64url-encoded.
func randomText(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

func (d *Dashboard) sign(parts ...string) string {
	m := hmac.New(sha256.New, d.cfg.CSRFKey)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkToken says whether token is one that token issued for cookie and
// actor less than tokenTTL ago, and returns its form id.
func (d *Dashboard) checkToken(token, cookie, actor string) (form string, ok bool) {
	issued, rest, _ := strings.Cut(token, ".")
	form, mac, _ := strings.Cut(rest, ".")
	at, err := strconv.ParseInt(issued, 10, 64)
	if err != nil || form == "" || !hmac.Equal([]byte(mac), []byte(d.sign(cookie, actor, issued, form))) {
		return "", false
	}
	age := time.Since(time.Unix(at, 0))
	return form, age < tokenTTL && age > -time.Minute
}

// authorizePost checks that POST r may act, and returns who acts; on
// false it has answered r with 403 and why. In order: [Config.Authorize]
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
	if err != nil || c.Value == "" {
		http.Error(w, "dashboard: missing or stale CSRF token; reload the page and try again", http.StatusForbidden)
		return "", false
	}
	if _, ok := d.checkToken(r.PostFormValue(csrfField), c.Value, actor); !ok {
		http.Error(w, "dashboard: missing, stale (over "+tokenTTL.String()+" old) or another actor's CSRF token; reload the page and try again", http.StatusForbidden)
		return "", false
	}
	return actor, true
}

// submitted remembers the forms posted in the last tokenTTL and where
// each led, so that a form posted twice (a double click, a reload) acts
// once. It is per process: behind a load balancer a second post that
// reaches another replica is not caught.
type submitted struct {
	mu sync.Mutex
	// forms maps a form id to where its post led; "" while it is being
	// carried out.
	forms map[string]submission
}

type submission struct {
	at       time.Time
	location string
}

// submitOnce claims r's form (after authorizePost passed): on false it has
// answered r, with a redirect to where the first post of the form led, or
// 409 while that is still under way. On true the caller acts and then
// calls done with where it led (the request's page), or with "" when it
// failed, which frees the form for another try.
func (d *Dashboard) submitOnce(w http.ResponseWriter, r *http.Request) (done func(location string), ok bool) {
	c, _ := r.Cookie(csrfCookie)
	actor, _ := d.actor(r)
	form, _ := d.checkToken(r.PostFormValue(csrfField), c.Value, actor)
	s := &d.submitted
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forms == nil {
		s.forms = map[string]submission{}
	}
	for k, v := range s.forms {
		if time.Since(v.at) > tokenTTL {
			delete(s.forms, k)
		}
	}
	if prev, seen := s.forms[form]; seen {
		if prev.location == "" {
			http.Error(w, "dashboard: this form is being submitted already", http.StatusConflict)
		} else {
			http.Redirect(w, r, prev.location, http.StatusSeeOther)
		}
		return nil, false
	}
	s.forms[form] = submission{at: time.Now()}
	return func(location string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if location == "" {
			delete(s.forms, form)
			return
		}
		s.forms[form] = submission{at: time.Now(), location: location}
	}, true
}

// actor asks [Config.Authorize] whether r may act.
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
