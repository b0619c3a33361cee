#!/usr/bin/env bash
# broker.sh: a real single-node Apache Kafka 4.x broker (KRaft, combined
# broker and controller) on 127.0.0.1, from Maven Central jars, no Docker.
#
#   broker.sh start     fetch jars if lib/ is missing, wipe the data dir,
#                       format it, start the broker in the background, wait
#                       until a metadata request succeeds, print the
#                       bootstrap address (127.0.0.1:PORT) on stdout:
#                         export KAFKA_BROKERS=$(integration/kafka/broker.sh start)
#   broker.sh stop      stop the broker by its pid and wait for it to exit
#   broker.sh restart   stop, then start on the SAME data dir (topics,
#                       records and group offsets survive)
#   broker.sh status    say whether it runs; exit 0 when it does
#
# Progress goes to stderr, the address alone to stdout. Every subcommand is
# idempotent: start on a running broker prints its address, stop on a
# stopped one does nothing. Runnable from any directory.
#
# Environment (all optional):
#   KAFKA_PORT             client port, default 9092
#   KAFKA_CONTROLLER_PORT  controller port, default 9093
#   KAFKA_RUN_DIR          data, log and pid, default integration/kafka/target/run
#   KAFKA_HEAP             JVM heap, default 512m
#   KAFKA_READY_TIMEOUT    seconds one start attempt may take, default 90
#   JAVA_HOME              the Java 17+ to run, default java on PATH
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

port=${KAFKA_PORT:-9092}
cport=${KAFKA_CONTROLLER_PORT:-9093}
run=${KAFKA_RUN_DIR:-$here/target/run}
heap=${KAFKA_HEAP:-512m}
ready_timeout=${KAFKA_READY_TIMEOUT:-90}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java

lib=$here/lib
data=$run/data
conf=$run/server.properties
log=$run/broker.log
pidfile=$run/broker.pid
ready=$here/target/bin/kafkaready
addr=127.0.0.1:$port
# Any fixed id will do: the data dir is formatted with it and only this
# broker reads it. A base64url-encoded UUID, as StorageTool random-uuid makes.
cluster_id=8GmpF0EmSk6dtTHKIlc9Kw

say() { echo "broker: $*" >&2; }

die() {
	say "$*"
	if [[ -s $log ]]; then
		echo "---- last 60 lines of $log ----" >&2
		tail -n 60 "$log" >&2
		echo "---- end of $log ----" >&2
	fi
	exit 1
}

# fetch_jars fills lib/ through a temporary folder, so an interrupted fetch
# never leaves a half-filled lib/ that looks complete.
fetch_jars() {
	if [[ -f $lib/.complete ]]; then
		return
	fi
	command -v mvn >/dev/null || die "mvn not found; install Maven (apt-get install maven)"
	say "fetching broker jars with Maven into $lib"
	local tmp=$here/target/lib.tmp
	rm -rf "$tmp"
	mkdir -p "$here/target"
	# Maven's output is shown only when it fails (with -q it says nothing
	# useful otherwise, only colour codes).
	if ! mvn -B -q -f "$here/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" >"$here/target/mvn.log" 2>&1; then
		cat "$here/target/mvn.log" >&2
		die "mvn dependency:copy-dependencies failed"
	fi
	ls "$tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "Maven fetched no kafka_2.13 jar into $tmp"
	touch "$tmp/.complete"
	rm -rf "$lib"
	mv "$tmp" "$lib"
}

build_ready() {
	command -v go >/dev/null || die "go not found; the readiness check is a Go program"
	(cd "$root" && go build -o "$ready" ./integration/kafka/cmd/kafkaready) ||
		die "go build ./integration/kafka/cmd/kafkaready failed"
}

# pid_alive: the pid file names a live process that is this broker (and not
# a recycled pid).
pid_alive() {
	[[ -f $pidfile ]] || return 1
	local pid
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "kafka.Kafka $conf" || return 1
	echo "$pid"
}

port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

write_conf() {
	mkdir -p "$run"
	{
		cat "$here/server.properties"
		echo
		echo "# appended by broker.sh"
		echo "log.dirs=$data"
		echo "controller.quorum.voters=1@127.0.0.1:$cport"
		echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
		echo "advertised.listeners=PLAINTEXT://$addr"
	} >"$conf"
}

java_opts() {
	echo "-Xms$heap -Xmx$heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20"
	echo "-XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true"
	echo "-Dlog4j2.configurationFile=$here/log4j2.properties"
}

# start_once starts one broker and waits for it; it returns non-zero (and
# leaves no process behind) when the broker exits or is not ready in time.
# With "fresh" it wipes the data dir first.
start_once() {
	local mode=$1
	for p in "$port" "$cport"; do
		if port_in_use "$p"; then
			die "127.0.0.1:$p is already in use by another process; set KAFKA_PORT / KAFKA_CONTROLLER_PORT"
		fi
	done
	if [[ $mode == fresh ]]; then
		rm -rf "$data"
	fi
	write_conf
	# shellcheck disable=SC2046 # word splitting of the options is meant
	"$java" $(java_opts) -cp "$lib/*" kafka.tools.StorageTool \
		format -t "$cluster_id" -c "$conf" --ignore-formatted >>"$log" 2>&1 ||
		{
			say "kafka.tools.StorageTool format failed"
			return 1
		}
	# setsid + nohup: the broker outlives this script and its terminal.
	# shellcheck disable=SC2046
	setsid nohup "$java" $(java_opts) -cp "$lib/*" kafka.Kafka "$conf" \
		>>"$log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$pidfile"
	local deadline=$((SECONDS + ready_timeout))
	while ((SECONDS < deadline)); do
		# By pid, not pid_alive: until nohup has exec'd java, the command
		# line is not yet the broker's.
		if ! alive "$pid"; then
			say "the broker exited during start-up"
			rm -f "$pidfile"
			return 1
		fi
		if "$ready" -brokers "$addr" -timeout 2s 2>>"$log"; then
			return 0
		fi
	done
	say "the broker was not ready after ${ready_timeout}s"
	kill_pid "$pid"
	rm -f "$pidfile"
	return 1
}

# alive: the process exists and is not a zombie. The broker is this
# script's child while start-up runs, so an exited broker stays a zombie
# (and passes kill -0) until the script ends.
alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat:0:1} != Z ]]
}

# kill_pid asks the process to stop, waits up to 60s for it to exit, and
# then kills it.
kill_pid() {
	local pid=$1
	kill -TERM "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 60))
	while alive "$pid" && ((SECONDS < deadline)); do
		sleep 0.2
	done
	if alive "$pid"; then
		say "pid $pid still alive after 60s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		while alive "$pid"; do sleep 0.1; done
	fi
}

stop_broker() {
	local pid
	if ! pid=$(pid_alive); then
		rm -f "$pidfile"
		return 0
	fi
	say "stopping pid $pid"
	kill_pid "$pid"
	rm -f "$pidfile"
	say "stopped"
}

start_broker() {
	local mode=$1
	if pid_alive >/dev/null; then
		say "already running (pid $(<"$pidfile")), reusing it"
		build_ready
		"$ready" -brokers "$addr" -timeout 30s || die "the running broker does not answer"
		echo "$addr"
		return
	fi
	"$java" -version >/dev/null 2>&1 || die "java not found; Kafka 4 needs Java 17+"
	fetch_jars
	build_ready
	mkdir -p "$run"
	if [[ -f $log ]]; then mv -f "$log" "$log.prev"; fi
	local t0ns
	t0ns=$(date +%s%N)
	local jar version
	jar=$(echo "$lib"/kafka_2.13-*.jar)
	version=${jar##*/kafka_2.13-}
	say "starting Kafka ${version%.jar} on $addr ($mode data dir $data)"
	if ! start_once "$mode"; then
		say "first start-up attempt failed; retrying once"
		echo "---- retry ----" >>"$log"
		start_once "$mode" || die "Kafka did not start on $addr"
	fi
	local ms=$((($(date +%s%N) - t0ns) / 1000000))
	say "ready on $addr in ${ms} ms (pid $(<"$pidfile"), log $log)"
	echo "$addr"
}

case ${1:-} in
start) start_broker fresh ;;
stop) stop_broker ;;
restart)
	stop_broker
	start_broker keep
	;;
status)
	if pid=$(pid_alive); then
		say "running, pid $pid, $addr"
	else
		say "not running"
		exit 1
	fi
	;;
*)
	echo "usage: $0 start|stop|restart|status" >&2
	exit 2
	;;
esac
