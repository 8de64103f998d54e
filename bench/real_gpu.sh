#!/bin/bash
# Real-GPU check: nvhook's bundle (make bundle) on a machine with a real NVIDIA driver and
# nothing else of ours. Lay out a directory D with this script as check.sh, the bundle
# as bundle.tar.gz, a runc binary (and lib/ with its libseccomp.so.2 if the machine has
# none), a test rootfs as rootfs.tar.gz (`nvhook sim rootfs DIR`, tarred) and
# deployments/kubernetes/daemonset.yaml; then, as root there: `DEV_ROOT=/usr/local/nvidia
# N=20 OUT=/tmp/out bash D/check.sh` (DEV_ROOT: the driver root; default: / or
# /usr/local/nvidia, whichever has libcuda). The issue notes of 21, 22 and 24 hold its
# output on an H100.
# runc (carried, with libseccomp) runs a busybox+glibc rootfs with nvhook's front as its
# prestart hook: nvidia-smi -L inside; start times exec'd (cold: NVML every start; warm:
# snapshot) and served, against runc alone; the shim in cdi mode with nvhook's CDI spec.
# DEV_ROOT=/path forces the driver root (a local dry run uses a simulated host).
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/devout}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
N=${N:-15}
P=/usr/local/lib/nvhook/current
export LD_LIBRARY_PATH=$D/lib
RUNC="$D/runc"
ms() { echo $(( ($2 - $1) / 1000000 )).$(( (($2 - $1) / 10000) % 100 )); }

echo "== host"
uname -r; nvidia-smi -L 2>&1 | head -4
ls -la /dev/nvidia* 2>&1 | head; cat /proc/driver/nvidia/version 2>&1 | head -2
ls /usr/local/nvidia 2>&1; ls /usr/local/nvidia/lib64 2>/dev/null | head -60 | tr '\n' ' '; echo
ldconfig -p | grep -E 'libnvidia-ml|libcuda\.' ; cat /etc/ld.so.conf.d/*.conf 2>/dev/null | head
stat -fc %T /sys/fs/cgroup; head -3 /proc/self/cgroup; findmnt -no SOURCE,FSTYPE,OPTIONS / 2>/dev/null
$RUNC --version | head -1

echo "== install: the image's tree, copied by the DaemonSet's install script"
rm -rf /tmp/img && mkdir -p /tmp/img && tar -C /tmp/img -xzf "$D/bundle.tar.gz"
python3 - "$D/daemonset.yaml" > /tmp/install.sh <<'PY'
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "DaemonSet"][0]
[c] = [c for c in ds["spec"]["template"]["spec"]["initContainers"] if c["name"] == "install"]
print(c["command"][-1].replace('"/usr/local/lib/nvhook/$v"', '"/tmp/img/usr/local/lib/nvhook/$v"').replace("/host/", "/"))
PY
mkdir -p /usr/local/lib/nvhook && NVHOOK_VERSION=0.1.0 sh -e /tmp/install.sh && ls -la /usr/local/lib/nvhook
$P/bin/nvhook --version && $P/bin/nvhook-hook --version

ROOT=${DEV_ROOT:-}
if [ -z "$ROOT" ]; then
    for r in / /usr/local/nvidia; do
        if $P/bin/nvhook --root $r list 2>/dev/null | grep -q 'libcuda\.so'; then ROOT=$r; break; fi
    done
fi
echo "== driver root: ${ROOT:-none found}"
for r in / /usr/local/nvidia; do echo "-- nvhook --root $r info"; $P/bin/nvhook --root $r info 2>&1 | head -12; done
[ -n "$ROOT" ] || { echo "no driver root with libcuda found"; exit 1; }
mkdir -p -m 0755 /etc/nvhook-dev /run/nvhook-dev
# A driver root without dev/ (a node's /usr/local/nvidia): the nodes are the host's.
DEVROOT_LINE=""; [ -e "$ROOT/dev/nvidiactl" ] || DEVROOT_LINE='dev-root = "/"'
for mode in cold warm; do
    snap=false; [ $mode = warm ] && snap=true
    cat > /etc/nvhook-dev/$mode.toml <<EOF
[nvidia-container-cli]
root = "$ROOT"
[nvhook]
$DEVROOT_LINE
snapshot = $snap
snapshot-dir = "/run/nvhook-dev/snap"
log-file = "/run/nvhook-dev/hook-$mode.log"
EOF
done
echo "-- list ($ROOT)"; $P/bin/nvhook --config /etc/nvhook-dev/warm.toml list | tee "$OUT/list.txt" | head -40
echo "-- NVML query vs snapshot"
for i in 1 2 3; do t0=$(date +%s%N); $P/bin/nvhook --config /etc/nvhook-dev/cold.toml info >/dev/null; t1=$(date +%s%N); echo "info (NVML every time): $(ms $t0 $t1) ms"; done
$P/bin/nvhook --config /etc/nvhook-dev/warm.toml info >/dev/null
for i in 1 2 3; do t0=$(date +%s%N); $P/bin/nvhook --config /etc/nvhook-dev/warm.toml info >/dev/null; t1=$(date +%s%N); echo "info (snapshot): $(ms $t0 $t1) ms"; done

echo "== bundle"
B=/tmp/nvhook-dev-bundle; rm -rf $B; mkdir -p $B/rootfs; tar -C $B/rootfs -xzf "$D/rootfs.tar.gz"
(cd $B && $RUNC spec)
mkconfig() {  # args: socket|none config args...
    sock=$1; cfg=$2; shift 2
    python3 - "$B/config.json" "$sock" "$cfg" "$P/bin/nvhook-hook" "$@" <<'PY'
import json, sys
path, sock, cfg, front, *args = sys.argv[1:]
c = json.load(open(path))
c["process"]["terminal"] = False
c["process"]["args"] = args
env = [e for e in c["process"]["env"] if not e.startswith("NVIDIA_")]
c["process"]["env"] = env + ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"]
c["root"]["readonly"] = False
c["hooks"] = {} if sock == "nohook" else {"prestart": [{"path": front, "args": ["nvhook-hook", "--config", cfg, "--socket", sock, "prestart"], "timeout": 60}]}
json.dump(c, open(path, "w"))
PY
}
runit() { (cd $B && $RUNC run "c$RANDOM$RANDOM" </dev/null); }

echo "-- inside, exec'd"
mkconfig none /etc/nvhook-dev/cold.toml sh -c 'nvidia-smi -L; ls /dev | grep nvidia | tr "\n" " "; echo; ls /usr/lib/x86_64-linux-gnu | grep -c nvidia'
runit; echo "exit $?"
tail -5 /run/nvhook-dev/hook-cold.log

echo "-- serve"
$P/bin/nvhook-hook --config /etc/nvhook-dev/warm.toml serve --socket /run/nvhook-dev/hook.sock > "$OUT/serve.log" 2>&1 &
SERVE=$!
for i in $(seq 100); do [ -S /run/nvhook-dev/hook.sock ] && break; sleep 0.2; done
mkconfig /run/nvhook-dev/hook.sock /etc/nvhook-dev/warm.toml sh -c 'nvidia-smi -L'
runit; echo "exit $?"; tail -2 "$OUT/serve.log"

echo "== timings (ms, runc run of 'true', $N each, interleaved)"
declare -A T
for i in $(seq $N); do
    for case in base cold warm served; do
        case $case in
            base) mkconfig nohook x true ;;
            cold) mkconfig none /etc/nvhook-dev/cold.toml true ;;
            warm) mkconfig none /etc/nvhook-dev/warm.toml true ;;
            served) mkconfig /run/nvhook-dev/hook.sock /etc/nvhook-dev/warm.toml true ;;
        esac
        t0=$(date +%s%N); runit >/dev/null 2>&1 || echo "$case run $i failed"; t1=$(date +%s%N)
        T[$case]="${T[$case]} $(( (t1 - t0) / 1000 ))"
    done
done
for case in base cold warm served; do
    python3 -c "import sys,statistics as s; v=sorted(int(x)/1000 for x in sys.argv[2:]); b=sys.argv[1]; print(f'{b:7s} median {s.median(v):7.1f}  min {v[0]:7.1f}  max {v[-1]:7.1f}')" $case ${T[$case]} | tee -a "$OUT/timings.txt"
done
echo "-- served requests"; grep -c 'status 0' "$OUT/serve.log"; tail -3 "$OUT/serve.log"

echo "== CDI: nvhook's spec, applied by nvhook's shim (cdi mode) in front of runc"
mkdir -p /run/nvhook-dev/cdi /run/nvhook-dev/cdi-x
$P/bin/nvhook --config /etc/nvhook-dev/warm.toml cdi generate --hook-socket /run/nvhook-dev/hook.sock --output /run/nvhook-dev/cdi/nvidia.yaml && $P/bin/nvhook cdi validate /run/nvhook-dev/cdi/nvidia.yaml
$P/bin/nvhook --config /etc/nvhook-dev/warm.toml cdi generate --hook-socket none --output /run/nvhook-dev/cdi-x/nvidia.yaml
grep -c 'name:' /run/nvhook-dev/cdi/nvidia.yaml; grep -A6 'hooks:' /run/nvhook-dev/cdi/nvidia.yaml | head -14
for m in cdi-exec:cdi:/run/nvhook-dev/none.sock cdi-served:cdi:/run/nvhook-dev/hook.sock \
         legacy-exec:legacy:/run/nvhook-dev/none.sock legacy-served:legacy:/run/nvhook-dev/hook.sock; do
    name=${m%%:*}; rest=${m#*:}; mode=${rest%%:*}; sock=${rest#*:}
    specs=/run/nvhook-dev/cdi; [ "${name%-exec}" != "$name" ] && specs=/run/nvhook-dev/cdi-x
    cat > /etc/nvhook-dev/$name.toml <<EOF
[nvidia-container-cli]
root = "$ROOT"
[nvidia-container-runtime]
mode = "$mode"
runtimes = ["$RUNC"]
[nvidia-container-runtime.modes.cdi]
spec-dirs = ["$specs"]
[nvhook]
$DEVROOT_LINE
socket = "$sock"
snapshot-dir = "/run/nvhook-dev/snap"
EOF
done
# Engines call create then start (the shim changes the spec on create only, as NVIDIA's).
csrun() {  # runtime config id: create (timed: CT, microseconds), start, wait, delete
    t0=$(date +%s%N)
    (cd $B && NVHOOK_CONFIG=/etc/nvhook-dev/$2.toml "$1" create "$3" </dev/null) || return 1
    t1=$(date +%s%N); CT=$(( (t1 - t0) / 1000 ))
    $RUNC start "$3" || return 1
    while $RUNC state "$3" 2>/dev/null | grep -q '"status": "running"'; do sleep 0.005; done
    $RUNC delete -f "$3"
}
cdiconfig() {  # args...: the annotation asks for GPU 0; no NVIDIA_* env
    mkconfig nohook x "$@"
    python3 - "$B/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.setdefault("annotations", {})["cdi.k8s.io/nvhook"] = "nvidia.com/gpu=0"
c["process"]["env"] = [e for e in c["process"]["env"] if not e.startswith("NVIDIA_")]
json.dump(c, open(sys.argv[1], "w"))
PY
}
echo "-- inside: shim cdi served, shim legacy served"
cdiconfig sh -c 'nvidia-smi -L'; csrun $P/bin/nvhook-runtime cdi-served cdi1; echo "exit $?"
mkconfig nohook x sh -c 'nvidia-smi -L'; csrun $P/bin/nvhook-runtime legacy-served leg1; echo "exit $?"
before=$(grep -c 'status 0' "$OUT/serve.log")
declare -A C
for i in $(seq $N); do
    mkconfig nohook x true
    csrun "$RUNC" cdi-exec "p$i" >/dev/null 2>&1 || echo "plain $i failed"; C[runc]="${C[runc]} $CT"
    for name in legacy-exec legacy-served; do
        mkconfig nohook x true
        csrun $P/bin/nvhook-runtime $name "$name$i" >/dev/null 2>&1 || echo "$name $i failed"; C[$name]="${C[$name]} $CT"
    done
    for name in cdi-exec cdi-served; do
        cdiconfig true
        csrun $P/bin/nvhook-runtime $name "$name$i" >/dev/null 2>&1 || echo "$name $i failed"; C[$name]="${C[$name]} $CT"
    done
done
echo "== create timings (ms, $N each, interleaved)"
for name in runc legacy-exec legacy-served cdi-exec cdi-served; do
    python3 -c "import sys,statistics as s; v=sorted(int(x)/1000 for x in sys.argv[2:]); print(f'create {sys.argv[1]:14s} median {s.median(v):7.1f}  min {v[0]:7.1f}  max {v[-1]:7.1f}')" $name ${C[$name]} | tee -a "$OUT/timings.txt"
done
echo "served requests during the create runs: $(( $(grep -c 'status 0' "$OUT/serve.log") - before ))"
kill $SERVE; wait $SERVE 2>/dev/null
echo "== done"
