package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox/dashboard"
)

// defaultDashboardListen is where the dashboard listens unless told:
// this machine only.
const defaultDashboardListen = "127.0.0.1:8080"

// dashboardCmd serves the dashboard of schema read-only on listen
// ("" means 127.0.0.1:8080), prints its URL to out, and shuts it down
// gracefully when ctx ends. The command has no way to know who is at the
// browser, so it offers no action: replaying, discarding and resolving
// gaps need the dashboard mounted in a service with Config.Authorize (see
// docs/dashboard.md). Listening on an address that is not a loopback one
// serves every client that reaches it, whatever name it uses: the command
// warns so at start.
func dashboardCmd(ctx context.Context, pool *pgxpool.Pool, schema, listen string, out io.Writer) error {
	return serveHandler(ctx, listen, "dashboard of schema "+schema, out, func(cfg *dashboard.Config) (http.Handler, error) {
		cfg.Schema = schema
		return dashboard.New(pool, cfg)
	})
}

// serveHandler serves the dashboard newDashboard makes, read-only, as
// dashboardCmd says; what names it in the line that gives its URL.
func serveHandler(ctx context.Context, listen, what string, out io.Writer, newDashboard func(*dashboard.Config) (http.Handler, error)) error {
	if listen == "" {
		listen = defaultDashboardListen
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("dashboard: -listen %q: want host:port, like %s", listen, defaultDashboardListen)
	}
	ip := net.ParseIP(host)
	remote := host != "localhost" && (ip == nil || !ip.IsLoopback())
	cfg := &dashboard.Config{AllowRemote: remote, Logger: slog.Default()}
	if remote {
		// The command cannot know the names it is reached by.
		cfg.Hosts = []string{"*"}
	}
	d, err := newDashboard(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("dashboard: listen on %s (in use? pick another with -listen): %w", listen, err)
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "%s, read-only, on http://%s/\n", what, ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("dashboard: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("dashboard: shut down: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: serve: %w", err)
	}
	return nil
}
