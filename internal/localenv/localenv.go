// Package localenv gives the example programs a PostgreSQL server and a
// Kafka cluster with no set-up: the ones named in the environment, or
// throwaway ones started in place.
package localenv

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/d419a114/outbox/internal/pgserver"
)

// Database returns DATABASE_URL, or starts a throwaway cluster from the
// machine's PostgreSQL binaries. Call stop when done.
func Database() (url string, stop func(), err error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url, func() {}, nil
	}
	srv, err := pgserver.Start()
	if err != nil {
		return "", nil, fmt.Errorf("start a throwaway PostgreSQL (or set DATABASE_URL): %w", err)
	}
	return srv.URL, func() { _ = srv.Stop() }, nil
}

// Kafka returns the brokers in KAFKA_BROKERS, or starts an in-process kfake
// cluster. Call stop when done.
func Kafka() (brokers []string, stop func(), err error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return strings.Split(env, ","), func() {}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, nil, errors.Join(errors.New("start in-process kfake"), err)
	}
	return c.ListenAddrs(), c.Close, nil
}
