#!/bin/sh
# Takes redirector off every node of the cluster (or the nodes named as arguments): one
# Job per node, deploy/uninstall.yaml with the node's name added to the Job's name and as
# its nodeName, waits for each to complete, prints their logs and deletes them (a Job that
# does not complete is left for `kubectl describe`). Delete the DaemonSet first
# (deploy/README.md, "Uninstall"). Re-running it is harmless: a Job that exists is left
# as it is, and the uninstall itself is idempotent.
#
#   deploy/uninstall.sh              # every node
#   deploy/uninstall.sh node-a node-b
#   KUBECTL="kubectl --context prod" deploy/uninstall.sh
set -eu
kubectl=${KUBECTL:-kubectl}
manifest=$(dirname "$0")/uninstall.yaml
if [ "$#" -eq 0 ]; then
  set -- $($kubectl get nodes -o 'jsonpath={.items[*].metadata.name}')
fi
jobs=""
for node in "$@"; do
  # A Job's name is a label value too: at most 63 characters, ending alphanumeric.
  job=$(printf 'redirector-uninstall-%s' "$node" | tr . - | cut -c1-63 | sed 's/-*$//')
  sed -e "s/^  name: redirector-uninstall\$/  name: $job/" \
      -e "s/^    spec:\$/    spec:\\n      nodeName: $node/" "$manifest" |
    $kubectl apply -f -
  jobs="$jobs job/$job"
done
# shellcheck disable=SC2086 # one argument per Job
$kubectl -n kube-system wait --for=condition=complete --timeout=300s $jobs
# Each Job's log, then the Jobs themselves: the nodes are clean.
for job in $jobs; do
  echo "== $job"
  $kubectl -n kube-system logs "$job" --all-containers
done
# shellcheck disable=SC2086
$kubectl -n kube-system delete $jobs
