#!/bin/sh
# Builds the programs tests/harness/k8scluster.py runs a one-node Kubernetes cluster with, from their
# upstream Go modules at pinned releases, into a cache outside the checkout that later runs reuse:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and kubectl (k8s.io/kubernetes),
# etcd (Debian 12's 3.4 is older than a 1.34 apiserver accepts), containerd with its runc shim and
# ctr (Debian 12's containerd 1.6 cannot inject CDI devices, which the DRA driver's claims are) and
# the CNI plugins a node needs to be Ready. Nothing of theirs is vendored: `go build` fetches the
# pinned modules through the Go module proxy. Usage: tools/k8s-cluster-bin.sh [--check] [CACHE];
# prints the binary directory (--check: only if it is complete, else exits 1 building nothing).
# Needs Go (GO, default /usr/local/go/bin/go or go in PATH) and network access on a cold cache.
set -eu

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
CONTAINERD_VERSION=v2.2.2
CNI_VERSION=v1.9.1
KEY="k8s-$K8S_VERSION-etcd-$ETCD_VERSION-containerd-$CONTAINERD_VERSION-cni-$CNI_VERSION"
CHECK=
if [ "${1:-}" = --check ]; then
	CHECK=1
	shift
fi
CACHE=${1:-/var/cache/nvc-py-k8s}
BIN="$CACHE/$KEY/bin"
PROGRAMS="kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl etcd containerd \
containerd-shim-runc-v2 ctr bridge host-local loopback"

complete() {
	for program in $PROGRAMS; do [ -x "$BIN/$program" ] || return 1; done
}
if complete; then
	echo "$BIN"
	exit 0
fi
[ -z "$CHECK" ] || exit 1

if [ -z "${GO:-}" ]; then
	if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else GO=$(command -v go || true); fi
fi
[ -n "$GO" ] && [ -x "$GO" ] || { echo "k8s-cluster-bin: no Go toolchain (set GO=)" >&2; exit 1; }

WORK="$CACHE/$KEY/build"
mkdir -p "$BIN" "$WORK"
# The module cache and build cache live beside the binaries: a cold build is not repeated for a
# second checkout, and `make clean` of a checkout does not drop them.
export GOPATH="$CACHE/gopath" GOCACHE="$CACHE/gocache" GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# module DIR MODULE@VERSION: a throwaway main module in DIR requiring MODULE@VERSION, to build its
# commands with (`go install M@V` refuses modules whose go.mod has replace directives, as these have).
module() {
	mkdir -p "$1"
	cd "$1"
	[ -f go.mod ] || "$GO" mod init nvc-py.test/k8s-cluster-bin >/dev/null 2>&1
	"$GO" mod edit -require="$2"
}

# Kubernetes: its go.mod replaces the k8s.io/* staging modules by directories of its own tree, which
# a dependency does not see; they are published as k8s.io/NAME v0.MINOR.PATCH.
module "$WORK/kubernetes" "k8s.io/kubernetes@$K8S_VERSION"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
gomod=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
for staging in $(sed -n 's#^\t\(k8s.io/[^ ]*\) => \./staging/.*#\1#p' "$gomod"); do
	"$GO" mod edit -replace="$staging=$staging@$STAGING_VERSION"
done

MINOR=${K8S_VERSION#v1.}
MINOR=${MINOR%%.*}
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	LDFLAGS="$LDFLAGS -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
	LDFLAGS="$LDFLAGS -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for cmd in kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
	[ -x "$BIN/$cmd" ] || "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done

module "$WORK/etcd" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"

[ -x "$BIN/etcd" ] || "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3

module "$WORK/containerd" "github.com/containerd/containerd/v2@$CONTAINERD_VERSION"

for cmd in containerd containerd-shim-runc-v2 ctr; do
	[ -x "$BIN/$cmd" ] || "$GO" build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		-o "$BIN/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
done

module "$WORK/cni" "github.com/containernetworking/plugins@$CNI_VERSION"

for plugin in main/bridge ipam/host-local main/loopback; do
	[ -x "$BIN/${plugin#*/}" ] || "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/${plugin#*/}" \
		"github.com/containernetworking/plugins/plugins/$plugin"
done

complete || { echo "k8s-cluster-bin: $BIN is incomplete" >&2; exit 1; }
# Built: the module and build caches (some 5 GB) go; a failed build keeps them for the next try.
"$GO" clean -modcache
rm -rf "$GOPATH" "$GOCACHE" "$WORK"
echo "$BIN"
