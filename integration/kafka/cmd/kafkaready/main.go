// Command kafkaready waits until a Kafka cluster answers a metadata request
// with at least one broker and a controller, or a deadline passes. broker.sh
// runs it to decide that a freshly started broker is ready.
//
//	kafkaready -brokers 127.0.0.1:9092 -timeout 2s
//
// It exits 0 when ready, 1 when the deadline passed (the last error on
// stderr), 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated seed brokers")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	flag.Parse()
	if *brokers == "" || *timeout <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	md, err := wait(ctx, strings.Split(*brokers, ","))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kafkaready: %s not ready after %s: %v\n", *brokers, *timeout, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kafkaready: cluster %s ready: %d broker(s), controller %d\n",
		md.Cluster, len(md.Brokers), md.Controller)
}

// wait repeats a metadata request until it succeeds or ctx ends, and returns
// the last error when ctx ends first.
func wait(ctx context.Context, seeds []string) (kadm.Metadata, error) {
	var last error
	for {
		md, err := metadata(ctx, seeds)
		if err == nil {
			return md, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return kadm.Metadata{}, last
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// metadata asks once, on a fresh client, so that a broker that restarted
// between attempts is not hidden behind a cached connection.
func metadata(ctx context.Context, seeds []string) (kadm.Metadata, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.RequestRetries(0),
		kgo.DialTimeout(time.Second),
	)
	if err != nil {
		return kadm.Metadata{}, err
	}
	defer cl.Close()
	reqCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).BrokerMetadata(reqCtx)
	if err != nil {
		return kadm.Metadata{}, err
	}
	if len(md.Brokers) == 0 {
		return kadm.Metadata{}, errors.New("metadata lists no broker")
	}
	if md.Controller < 0 {
		return kadm.Metadata{}, errors.New("metadata names no controller")
	}
	return md, nil
}
