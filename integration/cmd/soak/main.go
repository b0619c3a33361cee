// Command soak runs the mixed scenario for a bounded time against kfake (or
// KAFKA_BROKERS) and PostgreSQL (DATABASE_URL, or a throwaway cluster it
// starts and stops), prints progress while it runs and the history table,
// throughput and commit-to-handle latency at the end. It exits 1 when the
// history breaks a guarantee (lost, phantom, duplicate effects, reorders)
// and 2 when the run could not be set up or did not drain.
//
//	go run ./integration/cmd/soak -duration 2m
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/d419a114/outbox/integration/soak"
	"github.com/d419a114/outbox/internal/pgserver"
)

func main() { os.Exit(run()) }

func run() int {
	var cfg soak.Config
	flag.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long to write and inject faults (draining comes on top)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "schedule seed (0: time-based)")
	flag.IntVar(&cfg.Writers, "writers", 8, "concurrent writers")
	flag.IntVar(&cfg.Aggregates, "aggregates", 200, "aggregates to spread events over")
	flag.DurationVar(&cfg.MaxPause, "pause", 20*time.Millisecond, "longest random pause between a writer's transactions")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 2*time.Second, "mean pause between injected faults")
	flag.IntVar(&cfg.Concurrency, "concurrency", 1, "records in flight per partition in each consumer member (consumer.Config.Concurrency)")
	flag.DurationVar(&cfg.ProgressEvery, "progress", 5*time.Second, "progress line interval")
	flag.Parse()
	cfg.Progress = os.Stdout
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		cfg.Brokers = strings.Split(b, ",")
	}
	cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	if cfg.DatabaseURL == "" {
		srv, err := pgserver.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak: start PostgreSQL:", err)
			return 2
		}
		defer func() {
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "soak: stop PostgreSQL:", err)
			}
		}()
		cfg.DatabaseURL = srv.URL
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	kafka := "kfake (in-process, 3 brokers)"
	if len(cfg.Brokers) > 0 {
		kafka = strings.Join(cfg.Brokers, ",")
	}
	fmt.Printf("soak: %s of load against %s, seed %d\n", cfg.Duration, kafka, cfg.Seed)
	res, err := soak.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	fmt.Println()
	fmt.Print(res)
	if !res.OK() {
		fmt.Println("FAIL: the history breaks a guarantee")
		return 1
	}
	fmt.Println("ok")
	return 0
}
