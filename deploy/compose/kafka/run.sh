#!/bin/sh
# server.properties from the KAFKA_* variables by apache/kafka's rule (KAFKA_FOO_BAR -> foo.bar; __ -> _;
# ___ -> -), the storage formatted on the first start (CLUSTER_ID), then the broker in the foreground.
set -euf  # no globbing: the class path below is java's wildcard, not the shell's
props=/opt/kafka/config/server.properties
: > "$props"
env | grep '^KAFKA_' | grep -v -E '^KAFKA_(HEAP_OPTS|OPTS|JVM_PERFORMANCE_OPTS|LOG4J_OPTS)=' |
  while IFS='=' read -r name value; do
    key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
    printf '%s=%s\n' "$key" "$value" >> "$props"
  done
grep -q '^log\.dirs=' "$props" || echo "log.dirs=/var/lib/kafka/data" >> "$props"
java="java ${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g} -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -cp /opt/kafka/libs/*"
data=$(sed -n 's/^log\.dirs=//p' "$props" | cut -d, -f1)
if [ ! -f "$data/meta.properties" ]; then
  $java kafka.tools.StorageTool format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$props"
fi
exec $java kafka.Kafka "$props"
