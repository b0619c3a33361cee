#!/usr/bin/env bash
# connect.sh: a standalone Apache Kafka Connect 4.x worker with the Debezium
# PostgreSQL connector as a plugin, on 127.0.0.1, from Maven Central jars,
# no Docker. The worker runs no connector of its own: tests (and
# `connect.sh register`) add one per outbox schema through the REST API.
#
#   connect.sh start      fetch jars if lib/ or plugins/ are missing, wipe
#                         the offsets, start the worker in the background,
#                         wait until its REST API answers and the Debezium
#                         connector class is loaded, print the REST URL
#                         (http://127.0.0.1:PORT) on stdout:
#                           export CONNECT_URL=$(integration/connect/connect.sh start)
#   connect.sh stop       stop the worker by its pid (SIGTERM) and wait
#   connect.sh kill       kill -9 the worker, as a crash would
#   connect.sh restart    stop, then start on the SAME offsets file (the
#                         connectors' positions survive; their configs do
#                         not, in standalone mode: register them again)
#   connect.sh status     say whether it runs; exit 0 when it does
#   connect.sh register   register outbox-connector.json for one schema
#                         (environment below) and wait until its task runs
#                         and its replication slot is active
#
# Progress goes to stderr, the URL alone to stdout. start, stop and kill
# are idempotent. Runnable from any directory. The worker needs a broker:
# integration/kafka/broker.sh start.
#
# Environment (all optional):
#   KAFKA_BROKERS          bootstrap servers, default 127.0.0.1:9092
#   CONNECT_PORT           REST port, default 8083
#   CONNECT_RUN_DIR        offsets, config, log and pid, default
#                          integration/connect/target/run
#   CONNECT_HEAP           JVM heap, default 512m
#   CONNECT_READY_TIMEOUT  seconds a start may take, default 90
#   JAVA_HOME              the Java 17+ to run, default java on PATH
# For register (libpq's names): PGHOST (127.0.0.1), PGPORT (5432), PGUSER
# (postgres), PGPASSWORD (empty), PGDATABASE (postgres); OUTBOX_SCHEMA
# (outbox); CDC_NAME (outbox-cdc), CDC_SLOT (outbox_cdc) and
# CDC_PUBLICATION (outbox_cdc). The publication must exist (see
# docs/cdc.md); the connector creates the slot.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

brokers=${KAFKA_BROKERS:-127.0.0.1:9092}
port=${CONNECT_PORT:-8083}
run=${CONNECT_RUN_DIR:-$here/target/run}
heap=${CONNECT_HEAP:-512m}
ready_timeout=${CONNECT_READY_TIMEOUT:-90}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java

lib=$here/lib
plugins=$here/plugins
conf=$run/worker.properties
offsets=$run/connect.offsets
log=$run/connect.log
pidfile=$run/connect.pid
url=http://127.0.0.1:$port
main=org.apache.kafka.connect.cli.ConnectStandalone

say() { echo "connect: $*" >&2; }

die() {
	say "$*"
	if [[ -s $log ]]; then
		echo "---- last 80 lines of $log ----" >&2
		tail -n 80 "$log" >&2
		echo "---- end of $log ----" >&2
	fi
	exit 1
}

# fetch POM DEST CHECK fills DEST through a temporary folder, so an
# interrupted fetch never leaves a half-filled folder that looks complete.
fetch() {
	local pom=$1 dest=$2 check=$3
	if [[ -f $dest/.complete ]]; then
		return
	fi
	command -v mvn >/dev/null || die "mvn not found; install Maven (apt-get install maven)"
	say "fetching jars of $pom with Maven into $dest"
	local tmp=$dest.tmp
	rm -rf "$tmp"
	mkdir -p "$here/target"
	if ! mvn -B -q -f "$pom" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" >"$here/target/mvn.log" 2>&1; then
		cat "$here/target/mvn.log" >&2
		die "mvn dependency:copy-dependencies -f $pom failed"
	fi
	compgen -G "$tmp/$check" >/dev/null || die "Maven fetched no $check into $tmp"
	touch "$tmp/.complete"
	rm -rf "$dest"
	mv "$tmp" "$dest"
}

fetch_jars() {
	fetch "$here/pom.xml" "$lib" "connect-runtime-*.jar"
	# One folder per plugin under plugin.path: the Debezium connector gets
	# a class loader of its own.
	fetch "$here/debezium/pom.xml" "$plugins/debezium" "debezium-connector-postgres-*.jar"
}

# pid_alive: the pid file names a live process that is this worker (and
# not a recycled pid).
pid_alive() {
	[[ -f $pidfile ]] || return 1
	local pid
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$main $conf" || return 1
	echo "$pid"
}

# alive: the process exists and is not a zombie.
alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat:0:1} != Z ]]
}

port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

write_conf() {
	mkdir -p "$run"
	{
		cat "$here/worker.properties"
		echo
		echo "# appended by connect.sh"
		echo "bootstrap.servers=$brokers"
		echo "listeners=$url"
		echo "offset.storage.file.filename=$offsets"
		echo "plugin.path=$plugins"
	} >"$conf"
}

java_opts() {
	echo "-Xms$heap -Xmx$heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20"
	echo "-XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true"
	echo "-Dlog4j2.configurationFile=$here/log4j2.properties"
}

# ready: the REST API answers and lists the Debezium connector among the
# plugins it loaded (a worker whose plugin failed to load answers too).
ready() {
	curl -fsS --max-time 2 "$url/connector-plugins" 2>/dev/null |
		grep -qF io.debezium.connector.postgresql.PostgresConnector
}

start_worker() {
	local mode=$1
	if pid_alive >/dev/null; then
		say "already running (pid $(<"$pidfile")), reusing it"
		ready || die "the running worker at $url does not answer"
		echo "$url"
		return
	fi
	"$java" -version >/dev/null 2>&1 || die "java not found; Kafka Connect 4 needs Java 17+"
	command -v curl >/dev/null || die "curl not found; install it (apt-get install curl)"
	if port_in_use "$port"; then
		die "127.0.0.1:$port is already in use by another process; set CONNECT_PORT"
	fi
	fetch_jars
	mkdir -p "$run"
	if [[ $mode == fresh ]]; then
		rm -f "$offsets"
	fi
	if [[ -f $log ]]; then mv -f "$log" "$log.prev"; fi
	write_conf
	local t0ns
	t0ns=$(date +%s%N)
	say "starting Kafka Connect $(basename "$lib"/connect-runtime-*.jar .jar | sed 's/connect-runtime-//') with $(basename "$plugins"/debezium/debezium-connector-postgres-*.jar .jar) on $url (broker $brokers, $mode offsets $offsets)"
	# setsid + nohup: the worker outlives this script and its terminal.
	# shellcheck disable=SC2046 # word splitting of the options is meant
	setsid nohup "$java" $(java_opts) -cp "$lib/*" "$main" "$conf" \
		>>"$log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$pidfile"
	local deadline=$((SECONDS + ready_timeout))
	while ((SECONDS < deadline)); do
		if ! alive "$pid"; then
			rm -f "$pidfile"
			die "the worker exited during start-up"
		fi
		if ready; then
			local ms=$((($(date +%s%N) - t0ns) / 1000000))
			local rss
			rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo "?")
			say "ready on $url in ${ms} ms (pid $pid, RSS ${rss} kB, log $log)"
			echo "$url"
			return
		fi
		sleep 0.2
	done
	kill_pid "$pid" TERM
	rm -f "$pidfile"
	die "the worker was not ready after ${ready_timeout}s"
}

# kill_pid PID SIGNAL sends the signal, waits up to 60s for the process to
# exit, and then kills it.
kill_pid() {
	local pid=$1 sig=$2
	kill "-$sig" "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 60))
	while alive "$pid" && ((SECONDS < deadline)); do
		sleep 0.1
	done
	if alive "$pid"; then
		say "pid $pid still alive after 60s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		while alive "$pid"; do sleep 0.1; done
	fi
}

stop_worker() {
	local sig=$1 pid
	if ! pid=$(pid_alive); then
		rm -f "$pidfile"
		return 0
	fi
	say "stopping pid $pid (SIG$sig)"
	kill_pid "$pid" "$sig"
	rm -f "$pidfile"
	# The JVM's main thread shows as a zombie before its other threads
	# have exited and closed the listener: a restart right after a kill
	# found the port still taken. Wait for it to be free.
	local deadline=$((SECONDS + 30))
	while port_in_use "$port" && ((SECONDS < deadline)); do
		sleep 0.1
	done
	say "stopped"
}

register() {
	local name=${CDC_NAME:-outbox-cdc}
	local slot=${CDC_SLOT:-outbox_cdc}
	local body
	# sed, not envsubst: the template's ${routedByValue} is Debezium's.
	body=$(sed -e "s|@NAME@|$name|g" \
		-e "s|@PGHOST@|${PGHOST:-127.0.0.1}|g" -e "s|@PGPORT@|${PGPORT:-5432}|g" \
		-e "s|@PGUSER@|${PGUSER:-postgres}|g" -e "s|@PGPASSWORD@|${PGPASSWORD:-}|g" \
		-e "s|@PGDATABASE@|${PGDATABASE:-postgres}|g" -e "s|@SCHEMA@|${OUTBOX_SCHEMA:-outbox}|g" \
		-e "s|@SLOT@|$slot|g" -e "s|@PUBLICATION@|${CDC_PUBLICATION:-outbox_cdc}|g" \
		"$here/outbox-connector.json" | jq -c .config) || die "cannot fill $here/outbox-connector.json"
	say "registering connector $name at $url"
	curl -fsS --max-time 30 -X PUT -H 'Content-Type: application/json' \
		--data "$body" "$url/connectors/$name/config" >/dev/null ||
		die "PUT $url/connectors/$name/config failed"
	local deadline=$((SECONDS + ready_timeout)) state="" active=""
	while ((SECONDS < deadline)); do
		state=$(curl -fsS --max-time 2 "$url/connectors/$name/status" 2>/dev/null |
			jq -r '[.connector.state, (.tasks[]?.state)] | join(",")' 2>/dev/null || true)
		if [[ $state == *FAILED* ]]; then
			curl -fsS "$url/connectors/$name/status" >&2 || true
			die "connector $name failed"
		fi
		active=$(psql -XAtq -c "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'" 2>/dev/null || true)
		if [[ $state == RUNNING,RUNNING && $active == t ]]; then
			say "connector $name streams (slot $slot active)"
			return
		fi
		sleep 0.2
	done
	die "connector $name did not stream within ${ready_timeout}s (states: $state, slot active: $active)"
}

case ${1:-} in
start) start_worker fresh ;;
stop) stop_worker TERM ;;
kill) stop_worker KILL ;;
restart)
	stop_worker TERM
	start_worker keep
	;;
status)
	if pid=$(pid_alive); then
		say "running, pid $pid, $url"
	else
		say "not running"
		exit 1
	fi
	;;
register) register ;;
*)
	echo "usage: $0 start|stop|kill|restart|status|register" >&2
	exit 2
	;;
esac
