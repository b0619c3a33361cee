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

// A fleet's operators see one row per shard at /ops/ and drill into each
// shard's own dashboard at /ops/shards/NAME/.
func ExampleNewFleet() {
	eu1, closeEU1, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeEU1() }()
	eu2, closeEU2, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeEU2() }()

	f, err := dashboard.NewFleet([]dashboard.FleetShard{
		{Name: "eu-1", Pool: eu1.Pool, Schema: eu1.Schema},
		{Name: "eu-2", Pool: eu2.Pool, Schema: eu2.Schema},
	}, &dashboard.Config{Prefix: "/ops"})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", f)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, path := range []string{"/ops/", "/ops/shards/eu-2/"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(path, resp.Status, regexp.MustCompile(`<title>.*</title>`).FindString(string(body)))
	}
	// Output:
	// /ops/ 200 OK <title>Fleet · outbox</title>
	// /ops/shards/eu-2/ 200 OK <title>Overview · outbox</title>
}
