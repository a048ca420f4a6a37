#!/bin/bash
# The container image: deploy/image.sh makes it from the fresh root that package_test.sh
# installed and checked, with the tag deploy/k8s names; podman then runs rendezvousd in it
# as deploy/k8s/rendezvousd.yaml does (its command and flags, its user 65532 with the fsGroup,
# a read-only root, no capabilities, a root-owned 0440 token where the Secret goes), and this
# machine checks health, a set and a get with the token, and a refusal without it, from
# outside the container. The worker self-check runs in it too.
#   package_image_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$2
root=$build/package-test/root
fail() { echo "package_image_test: $*" >&2; exit 1; }
skip() { echo "package_image_test: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root"
command -v podman >/dev/null || fail "podman is missing (deploy/setup.sh installs it)"
[ -f "$root.checked" ] || fail "no checked fresh root in $root (package_test.sh makes it)"
label=muster-image-test
# A run killed before its trap (a ctest timeout) leaves its container: remove those.
podman ps -aq --filter "label=$label" | xargs -r podman rm -f >/dev/null 2>&1 || true

# crun (podman's default) refuses this machine's hybrid cgroups (v1 with a v2 hierarchy):
# "crun: cgroups in hybrid mode not supported". runc runs here; podman's default limits
# (4194304 processes, 1048576 files) are above this machine's hard limits, which a
# container cannot raise, so it is given those. Whether containers run at all is asked of
# the root itself, before any image: a broken image must fail, not skip.
run=(podman)
command -v runc >/dev/null && run+=(--runtime runc)
run+=(run --network host --label "$label" --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)"
      --ulimit "nproc=4096:4096")
probe=$("${run[@]}" --rm --rootfs "$root" /usr/bin/true 2>&1) \
  || skip "podman cannot run containers on this machine: $probe"

version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
tag=$("$source/deploy/image.sh" --root "$root") || fail "deploy/image.sh failed"
[ "$tag" = "registry.example.com/muster:$version" ] || fail "deploy/image.sh tagged $tag, not version $version"
podman image exists "$tag" || fail "no image $tag after deploy/image.sh"
echo "package_image_test: image $tag ($(podman image inspect --format '{{.Size}}' "$tag") bytes)"
if podman image inspect --format '{{.Config.Cmd}}' "$tag" | grep -qv -- '--token-file='; then
  fail "the image's default command serves without a token"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/muster-image-XXXXXX")
name=$label-$$
cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

# The self-check: launch and two workers in the container.
out=$("${run[@]}" --rm "$tag" launch --nproc_per_node=2 --master_port=0 worker 2>&1) \
  || { echo "$out" >&2; fail "launch --nproc_per_node=2 worker failed in the container"; }
grep -q '^self-check passed: 2 rank(s)' <<<"$out" || { echo "$out" >&2; fail "no self-check line"; }

# rendezvousd as the manifest runs it, on a free port of this machine.
mapfile -t spec < <(/usr/bin/python3 - "$source/deploy/k8s/rendezvousd.yaml" <<'PY'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "Deployment":
        pod = doc["spec"]["template"]["spec"]
        c = pod["containers"][0]
        mode = next(v["secret"]["defaultMode"] for v in pod["volumes"] if v["name"] == "token")
        print(c["image"])
        print(pod["securityContext"]["runAsUser"])
        print(pod["securityContext"].get("fsGroup", ""))
        print(oct(mode)[2:])
        print(c["securityContext"]["readOnlyRootFilesystem"])
        for a in c["command"] + c["args"]:
            print(a)
PY
)
[ "${spec[0]}" = "$tag" ] || fail "the manifest names ${spec[0]}, deploy/image.sh made $tag"
user=${spec[1]}
group=${spec[2]}
mode=${spec[3]}
# From tests/support/ports.py's band, below the ephemeral range: no bind(0) or connect() of a
# test beside this one takes it before the container binds it (its lock ends with the script
# that printed it; the band's other tests pick among 12,000 ports at random).
port=$(/usr/bin/python3 "$source/tests/support/ports.py")
args=()
for a in "${spec[@]:5}"; do args+=("$(sed -E "s/^--port=[0-9]+$/--port=$port/" <<<"$a")"); done
token=5ecret-of-the-image-test
mkdir -p "$work/token"
echo "$token" >"$work/token/token"
# As the kubelet writes a Secret: root's, the fsGroup's group, the manifest's mode.
chown "0:${group:-0}" "$work/token/token"
chmod "$mode" "$work/token/token"
security=(--user "$user:0" --cap-drop=ALL --security-opt no-new-privileges)
[ -n "$group" ] && security+=(--group-add "$group")
[ "${spec[4]}" = True ] && security+=(--read-only --read-only-tmpfs=false)
"${run[@]}" -d --name "$name" "${security[@]}" -v "$work/token:/etc/muster/token:ro" "$tag" \
  "${args[@]}" >/dev/null || fail "podman could not start rendezvousd"
ctl=$build/rendezvous/rendezvousctl
health=""
for _ in $(seq 300); do  # 60 s
  health=$("$ctl" --addr="127.0.0.1:$port" --timeout=1 health 2>/dev/null) && [ "$health" = SERVING ] && break
  [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] \
    || { podman logs "$name" >&2; fail "rendezvousd in the container exited"; }
  sleep 0.2
done
[ "$health" = SERVING ] || { podman logs "$name" >&2; fail "no SERVING from 127.0.0.1:$port"; }
echo "$token" >"$work/client-token"
"$ctl" --addr="127.0.0.1:$port" --token-file="$work/client-token" set image-test ok >/dev/null \
  || fail "the store refused a set with its token"
[ "$("$ctl" --addr="127.0.0.1:$port" --token-file="$work/client-token" get image-test)" = ok ] \
  || fail "the store did not keep the key"
if "$ctl" --addr="127.0.0.1:$port" --timeout=5 get image-test >/dev/null 2>&1; then
  fail "the store in the container answered without the token"
fi
podman stop -t 15 "$name" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { podman logs "$name" >&2; fail "rendezvousd exited $code on podman stop"; }
echo "package_image_test: rendezvousd in $tag as the manifest runs it (user $user, group $group, read-only, no capabilities) answered $health on 127.0.0.1:$port; self-check passed in the container"
