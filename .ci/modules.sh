#!/usr/bin/env bash
# The modules resolve the way a user's build resolves them: the core and
# both adapters are packed as version $version into a file-system module
# proxy (the layout `go help goproxy` describes: @v/list, .info, .mod,
# .zip), and a throwaway module outside the repository, with no go.work
# and no replace, requires the three at that version and builds a program
# that uses all three. It fails when an adapter's go.mod leans on the tree
# (a replace, a version that is not the core's release), when the core's
# go.mod asks more than its users have, or when a module's files break the
# module zip's rules.
#
#	.ci/modules.sh              # from .ci/run, or alone from anywhere in the tree
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=v0.1.0
core=github.com/d419a114/outbox

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
proxy=$work/proxy

# pack adds module $1 from directory $2 of the tree to the proxy: the files
# git tracks there, without those of nested modules, as the go command
# would download them from the repository at a tag.
pack() {
	local mod=$1 dir=$2
	local stage=$work/stage/$mod
	local at=$stage/$mod@$version
	local nested
	nested=$(git ls-files "$dir" | grep '/go\.mod$' | xargs -rn1 dirname | grep -vx "$dir" || true)
	mkdir -p "$at" "$proxy/$mod/@v"
	git ls-files -z "$dir" | while IFS= read -r -d '' f; do
		local rel=${f#"$dir"/}
		[[ $dir == . ]] && rel=$f
		local skip=
		for n in $nested; do
			[[ $f == "$n"/* ]] && skip=1
		done
		[[ -n $skip ]] && continue
		mkdir -p "$at/$(dirname "$rel")"
		cp "$f" "$at/$rel"
	done
	(cd "$stage" && TZ=UTC zip -qrX "$proxy/$mod/@v/$version.zip" "$mod@$version")
	cp "$dir/go.mod" "$proxy/$mod/@v/$version.mod"
	printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(git log -1 --format=%cI)" >"$proxy/$mod/@v/$version.info"
	echo "$version" >"$proxy/$mod/@v/list"
}

if grep -n '^replace' go.mod outboxotel/go.mod outboxprom/go.mod; then
	echo "a module's go.mod has a replace directive: a user's build ignores it; put it in go.work"
	exit 1
fi
for a in outboxotel outboxprom; do
	if ! grep -q "^	$core $version\$" "$a/go.mod"; then
		echo "$a/go.mod does not require $core $version, the version it is released with"
		exit 1
	fi
done

pack "$core" .
pack "$core/outboxotel" outboxotel
pack "$core/outboxprom" outboxprom

# The user's module: requires what a user's go get writes, builds a
# program that wires a relay and a consumer to both adapters.
user=$work/user
mkdir -p "$user"
cat >"$user/go.mod" <<EOF
module example.com/user

go $(awk '$1 == "go" {print $2}' go.mod)

require (
	$core $version
	$core/outboxotel $version
	$core/outboxprom $version
)
EOF
cat >"$user/main.go" <<'EOF'
// Command user wires a relay and a consumer to Prometheus and
// OpenTelemetry at once, the way a service would.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/outboxotel"
	"github.com/d419a114/outbox/outboxprom"
	"github.com/d419a114/outbox/producer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	reg := prometheus.NewRegistry()
	rm, err := outboxprom.NewRelayMetrics(reg)
	if err != nil {
		return err
	}
	rt, err := outboxotel.NewRelayTracer(nil)
	if err != nil {
		return err
	}
	cm, err := outboxprom.NewConsumerMetrics(reg, "billing")
	if err != nil {
		return err
	}
	ct, err := outboxotel.NewConsumerTracer("billing", nil)
	if err != nil {
		return err
	}
	w := producer.NewWriter(&producer.WriterConfig{Propagator: outboxotel.NewPropagator(nil)})
	relayCfg := &producer.RelayConfig{Tracer: producer.Tracers(rm, rt)}
	consumerCfg := &consumer.Config{Tracer: consumer.Tracers(cm, ct)}
	handler := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	fmt.Println(w != nil, relayCfg.Tracer != nil, consumerCfg.Tracer != nil, handler != nil)
	return nil
}
EOF

# Versions the tree's go.sum files already vouch for are checked against
# them; the three packed modules are not in the checksum database (they
# are not published), so it is not asked about them.
cat go.sum outboxotel/go.sum outboxprom/go.sum | sort -u >"$user/go.sum"
# A module cache of its own, so that no version packed here outlives the
# run (a cached v0.1.0 would be used instead of the tree's next time);
# the machine's cache, a proxy in the same layout, serves the rest.
upstream=$(go env GOPROXY)
cache=$(go env GOMODCACHE)/cache/download
(
	cd "$user"
	export GOWORK=off GOFLAGS=-mod=mod GOMODCACHE="$work/modcache" \
		GOPROXY="file://$proxy,file://$cache,$upstream" \
		GONOSUMDB=$core GOPRIVATE= GONOPROXY= GOTOOLCHAIN=local
	go mod tidy
	go vet ./...
	go build -o "$work/user-bin" .
	go list -m all | grep "^$core"
)
"$work/user-bin" >/dev/null
echo "modules: $core, $core/outboxotel and $core/outboxprom $version resolve and build from a module proxy"
