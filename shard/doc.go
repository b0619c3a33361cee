// Package shard names the databases of a fleet: the shards that hold outbox
// tables (a database and a schema, so tenant schemas on one server are
// shards too) and the targets a routing consumer applies records in.
//
// A fleet is given in Go, as a [Fleet] value, or in a JSON file read by
// [Load]:
//
//	{
//	  "shards": [
//	    {"name": "eu-1", "database": "postgres://relay@db-eu-1/payments"},
//	    {"name": "tenant-042", "database": "postgres://relay@db-t/app", "schema": "tenant_042"}
//	  ],
//	  "targets": [
//	    {"name": "ledger-a", "database": "postgres://ledger@db-la/ledger"}
//	  ]
//	}
//
// Keep passwords out of the file: the connection strings are pgx's, which
// read PGPASSWORD and ~/.pgpass (PGPASSFILE) like libpq.
//
// The model is one aggregate on one shard at a time: per-aggregate order
// holds across the fleet, and there is no order across shards.
package shard
