package dashboard_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/internal/pgtest"
)

// A service mounts the dashboard under /outbox on its own mux, letting
// only its operators act (here everyone on loopback is "alice"; use your
// session or proxy headers), and GETs the overview.
func Example() {
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()

	d, err := dashboard.New(db.Pool, &dashboard.Config{
		Schema: db.Schema,
		Prefix: "/outbox",
		Authorize: func(r *http.Request) (string, bool) {
			return "alice", true
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", d)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/outbox/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.Status)
	fmt.Println(regexp.MustCompile(`<title>.*</title>`).FindString(string(body)))
	fmt.Println(regexp.MustCompile(`acting as <b>\w+</b>`).FindString(string(body)))
	// Output:
	// 200 OK
	// <title>Overview · outbox</title>
	// acting as <b>alice</b>
}
