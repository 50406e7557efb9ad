#!/bin/sh
# Installs redirector-cni on the node: the plugin binary into the CNI bin dir, and a
# `redirector-cni` entry appended to the cluster network's conflist (chained after the
# cluster's own plugins). Idempotent; the conflist is rewritten atomically with its mode
# kept, so the container runtime never reads a half-written file.
set -eu
BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
CONF_DIR=${CNI_CONF_DIR:-/host/etc/cni/net.d}
ARGS=${REDIRECTOR_CNI_ARGS:-'["-p","15001","-z","15006","-u","1337","-m","REDIRECT","-i","*","-x","","-b","*","-d","15090,15021,15020"]'}

cp /usr/local/bin/redirector "$BIN_DIR/redirector-cni.new"
mv "$BIN_DIR/redirector-cni.new" "$BIN_DIR/redirector-cni"

conf=$(ls "$CONF_DIR"/*.conflist 2>/dev/null | sort | head -n 1)
if [ -z "$conf" ]; then
  echo "install-cni: no .conflist in $CONF_DIR yet (is the cluster network installed?)" >&2
  exit 1
fi
if grep -q '"redirector-cni"' "$conf"; then
  echo "install-cni: $conf already chains redirector-cni"
  exit 0
fi
entry=$(printf '{"type":"redirector-cni","socket":"/run/redirector/redirector.sock","args":%s,"capabilities":{"io.kubernetes.cri.pod-annotations":true}}' "$ARGS")
tmp="$conf.redirector.tmp"
# Append the entry to the "plugins" list: the last "]" of the file closes it.
awk -v entry="$entry" '
  { lines[NR] = $0 }
  END {
    for (i = NR; i > 0; i--) if (lines[i] ~ /\]/) { last = i; break }
    for (i = 1; i <= NR; i++) {
      if (i == last) { sub(/\]/, "," entry "]", lines[i]) }
      print lines[i]
    }
  }' "$conf" > "$tmp"
chmod --reference="$conf" "$tmp"
mv "$tmp" "$conf"
echo "install-cni: chained redirector-cni into $conf"
