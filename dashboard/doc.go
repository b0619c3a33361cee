// Package dashboard is a web dashboard for the outbox tables of one
// schema: an http.Handler to mount in a service (or run with `outbox
// dashboard`), rendered on the server with html/template from embedded
// templates, with no JavaScript.
//
// It shows the producer's backlog, dead events and relay instances; per
// consumer its open dead letters (grouped by failure fingerprint, with
// filters and paging), one letter in full, its gaps and the records
// parked behind them; and the operator requests and audit log of package
// operator. Over many shards, [NewFleet] adds an overview with one row
// per shard and serves each shard's dashboard beneath it.
//
// # Safety
//
// The dashboard is read-only unless [Config.Authorize] allows a request's
// actions: without it every POST is refused with 403 and no action is
// offered. Every GET only reads. Every POST carries a token tied to a
// cookie (double submit, signed with [Config.CSRFKey]) and passes
// net/http's CrossOriginProtection; a POST without both is refused with
// 403. Clients that do not connect from a loopback address are refused
// unless [Config.AllowRemote] is set.
//
// Every action first shows a confirmation that says what it will touch:
// how many letters (consumer.Inspector.PreviewLetters, capped at [Config.CountCap]),
// how many aggregates, and which parked successors drain. A consumer's
// actions are operator requests (operator.Store.Submit, with the
// authorized actor as RequestedBy): the consumer's running process, which
// has the handler, carries them out, and the request's page follows it
// to its outcome. A producer dead event is replayed or discarded at once,
// with an audit row in the same transaction.
//
// # Bounds
//
// Every listing pages by id with [Config.PageSize] rows a page, and every
// count that could grow with the tables stops at [Config.CountCap] and is
// shown as "10000+": a page costs the same with a million dead letters as
// with ten.
package dashboard
