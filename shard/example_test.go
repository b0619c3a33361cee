package shard_test

import (
	"fmt"
	"strings"

	"github.com/d419a114/outbox/shard"
)

func ExampleParse() {
	f, err := shard.Parse(strings.NewReader(`{
		"shards": [
			{"name": "eu-1", "database": "postgres://relay@db-eu-1/payments"},
			{"name": "tenant-042", "database": "postgres://relay@db-t/app", "schema": "tenant_042"}
		]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range f.Shards {
		server, _ := s.Server()
		fmt.Println(s.Name, server, s.Schema)
	}
	// Output:
	// eu-1 db-eu-1:5432/payments@relay outbox
	// tenant-042 db-t:5432/app@relay tenant_042
}
